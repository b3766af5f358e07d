"""The store's plain data and its location helpers: what Store operations take and
return (``LeadRow``, ``StoreSummary``, …), ``check_scope``, and ``open_store``, which picks
the adapter from the location.

Light on purpose: the adapters and ``runner status`` import this module, never the
``Store`` protocol (``runner.store``, which re-exports every name here), so a command
does not load the lifecycle and pipeline ports only to read the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from runner.errors import ConfigMismatch
from runner.ids import WriteId
from runner.states import LeadState

if TYPE_CHECKING:
    from runner.models import LeadEvent, Scope
    from runner.store import Store

AcceptResultKind = Literal["accepted", "duplicate", "conflict"]

#: a pinned scope as stored: its four fields (no model, so ``status`` stays light)
ScopeData = dict[str, str]


@dataclass(frozen=True)
class AcceptOutcome:
    result: AcceptResultKind
    write_id: WriteId


@dataclass(frozen=True)
class AcceptItem:
    """One validated event to accept, with its canonical JSON and a fresh write_id (used
    only if the key is new)."""

    event: LeadEvent
    canonical: str
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
    #: whether the event carries a ``contact_alias``; never its value (K7)
    contact_alias_present: bool = False


@dataclass(frozen=True)
class LeadWork:
    """A record the cycle works on: its key, write_id, state and validated event."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    state: LeadState
    event: LeadEvent


ObservationOutcome = Literal["changed", "unchanged", "missing", "failed"]


@dataclass(frozen=True)
class PollTarget:
    """A confirmed record due for a status poll, with its last snapshot (canonical JSON)."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    snapshot: str | None


@dataclass(frozen=True)
class ObservationWrite:
    """What to store for one observation (L11): ``changed`` stores ``snapshot`` (canonical
    JSON) and writes a ``status_changed`` event; ``unchanged`` and ``failed`` only move the
    poll time; ``missing`` makes the record ``confirmed_then_missing``."""

    write_id: WriteId
    outcome: ObservationOutcome
    snapshot: str | None = None


@dataclass(frozen=True)
class StoreSummary:
    """Everything ``status`` shows except the record list (which is streamed)."""

    scope: ScopeData | None  # the pinned scope's fields (no model: status stays light)
    schema_version: int
    counts: dict[LeadState, int]
    outbox_count: int
    outbox_last_seq: int
    outbox_by_kind: dict[str, int]
    poll_health: list[dict[str, Any]] = field(default_factory=list)


def check_scope(pinned: ScopeData | None, wanted: Scope | None) -> None:
    """Refuse (exit 78) a scope that differs from the pinned one; change nothing."""
    if wanted is None or pinned is None:
        return
    want = wanted.model_dump()
    if pinned != want:
        differ = [name for name in want if pinned.get(name) != want[name]]
        raise ConfigMismatch(
            "the store is pinned to another scope (" + ", ".join(differ) + " differ); "
            "nothing was changed"
        )


def is_postgres(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def describe_location(location: str) -> str:
    """A store's location for messages: a path, or ``schema 'x' at host:port/db`` (a DSN
    is never echoed: it may carry a password)."""
    if is_postgres(location):
        from runner.io.postgres.dsn import describe, schema_of

        return f"schema {schema_of(location)!r} at {describe(location)}"
    return repr(location)


async def store_exists(location: str) -> bool:
    """Whether a store is at ``location`` (a file; on PostgreSQL, runner's schema in the
    database), without creating anything."""
    if is_postgres(location):
        from runner.io.postgres import postgres_store_exists

        return await postgres_store_exists(location)
    import anyio

    return await anyio.Path(location).exists()


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
        from runner.io.postgres import open_postgres_store

        return await open_postgres_store(location, scope=scope, create=create)
    from runner.io.sqlite.store import open_sqlite_store

    return await open_sqlite_store(location, scope=scope, create=create)
