"""The Store port: domain operations, not SQL (ARCHITECTURE idea 1 and 3).

The store is the truth.  Every operation here is one transaction, and every state change
commits together with its outbox event (K3).  Tasks and the worker only ever talk to this
protocol; SQLite (``runner.io.sqlite``) and PostgreSQL adapters implement it, and
backend-specific SQL stays inside them.

``open_store`` picks the adapter from the location: a ``postgresql://`` DSN or a file path.
Adapters are imported lazily, so a command never loads a driver it does not use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from runner.lifecycle.port import CandidateStore
from runner.models import LeadEvent, Scope, WriteId
from runner.states import LeadState

AcceptResultKind = Literal["accepted", "duplicate", "conflict"]


@dataclass(frozen=True)
class AcceptOutcome:
    result: AcceptResultKind
    write_id: WriteId


@dataclass(frozen=True)
class LeadRow:
    """A lead record as the store holds it (never the contact fields)."""

    seq: int
    tenant_id: str
    source_lead_id: str
    write_id: WriteId
    state: LeadState
    attempts: int
    reconcile_attempts: int
    snapshot: dict[str, Any] | None
    last_polled_at: str | None


@dataclass(frozen=True)
class StoreSummary:
    """Everything ``status`` shows except the record list (which is streamed)."""

    scope: Scope | None
    schema_version: int
    counts: dict[LeadState, int]
    outbox_count: int
    outbox_last_seq: int
    outbox_by_kind: dict[str, int]
    poll_health: list[dict[str, Any]] = field(default_factory=list)


class Store(CandidateStore, Protocol):
    """A durable store.  Use as ``async with await open_store(...) as store``.

    The candidate lifecycle operations (SPEC C) come from ``CandidateStore``."""

    backend: str

    @property
    def scope(self) -> Scope | None:
        """The scope pinned into the store, if any command has pinned one."""
        ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Store: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        """Insert the event if its key is new (with an ``accepted`` outbox event), else
        say ``duplicate`` (same canonical JSON) or ``conflict``; commits before returning.
        """
        ...

    def reading(self) -> AbstractAsyncContextManager[None]:
        """A consistent read view: ``summary()`` and ``iter_records()`` inside it see one
        snapshot of the store (a read transaction)."""
        ...

    async def summary(self) -> StoreSummary:
        """Counts, outbox figures and poll health, from one consistent read."""
        ...

    def iter_records(self, *, page: int = 1000) -> AsyncIterator[LeadRow]:
        """Every lead record in accept order, streamed (never all in memory at once)."""
        ...


def is_postgres(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


async def open_store(
    location: str, *, scope: Scope | None = None, create: bool = True
) -> Store:
    """Open (and with ``create``, create and migrate) the store at ``location``.

    With ``scope``, the scope is pinned if the store has none yet, in the same transaction
    that creates the store (K9), or compared with the pinned one (ConfigMismatch, exit 78).
    Without ``create`` nothing is written: a missing store is StoreNotFound and an older
    schema is reported, not migrated.
    """
    if is_postgres(location):
        from runner.errors import UsageError

        raise UsageError("PostgreSQL stores are not available in this version yet")
    from runner.io.sqlite.store import open_sqlite_store

    return await open_sqlite_store(location, scope=scope, create=create)
