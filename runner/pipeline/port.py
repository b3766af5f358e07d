"""The pipeline part of the Store port: domain operations, not SQL (SPEC P2-P4, P9, P11).

Each operation is one transaction.  Stages, workers and jobs only ever talk to this
protocol; SQLite and PostgreSQL adapters implement it with their own SQL.

Recovery policy: *retry* (K5).  Pipeline work is internal and idempotent, so a batch
whose owner died simply becomes claimable again when its lease runs out; no sweeper is
needed, and every write that ends a claim is guarded by the lease (fencing token, state,
expiry), so a worker that lost its lease writes nothing.

Pipeline bookkeeping writes no outbox events: the outbox is the lead workload's history,
and raw ingestion reads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from runner.pipeline.model import (
    Claim,
    Completion,
    LevelCounts,
    NewRecord,
    OutboxEvent,
    ProcessorRef,
    Stage,
    WorkerConfigView,
)

if TYPE_CHECKING:  # the prune's answer: not on status's path
    from runner.pipeline.retention import PipelinePrune


class Wakeups(Protocol):
    """Wake-ups for a consumer (P9): ``wait`` returns when the store may have new work or
    after ``seconds``, whichever comes first.  Only a hint: the store is the truth,
    and every consumer polls as well."""

    async def wait(self, seconds: float) -> None: ...


class PipelineStore(Protocol):
    # -- processors and backlog ------------------------------------------------------

    async def register_processors(self, refs: Sequence[ProcessorRef], now_ms: int) -> None:
        """Record the processors a worker or job runs, and put every input that is not
        terminal for a (name, version) seen for the first time into its backlog (an
        input terminal under an older version too, unless the processor declares
        otherwise)."""
        ...

    async def sync_backlog(self, ref: ProcessorRef, now_ms: int, *, force: bool = False
                           ) -> int:
        """Create the missing work rows of ``ref`` (set-based, idempotent).  With
        ``force``, every input of its level gets one, and terminal ones go back to the
        backlog too (force replay); their outcomes stay until new ones are recorded.
        Returns how many rows became pending."""
        ...

    async def registered_processors(self) -> list[ProcessorRef]:
        """Every processor at its current (highest registered) version."""
        ...

    async def backlog(self, refs: Sequence[ProcessorRef]) -> dict[str, int]:
        """Pending inputs per ``processor@version``: inputs of its level without a
        terminal outcome (counted from the records, so an input whose work row does not
        exist yet is pending too)."""
        ...

    # -- claims and leases ------------------------------------------------------------

    async def claim(self, ref: ProcessorRef, owner: str, limit: int, lease_ms: int,
                    now_ms: int) -> Claim:
        """Claim up to ``limit`` claimable inputs (pending and due, or under an expired
        lease) under one new fencing token; the claim may hold no item."""
        ...

    async def renew(self, claim: Claim, lease_ms: int, now_ms: int) -> int:
        """Extend the lease of every item still held under ``claim.token``; raises
        LeaseLost (and changes nothing) if any item is no longer held.  Returns the new
        expiry."""
        ...

    async def complete(self, claim: Claim, completions: Sequence[Completion],
                       now_ms: int) -> None:
        """Write the outputs and outcomes of a claimed batch in one transaction.  Raises
        LeaseLost and writes nothing unless every item is still held under the claim's
        token, unexpired.  An input that changed since it was claimed goes back to the
        backlog instead of becoming terminal."""
        ...

    async def release(self, claim: Claim, now_ms: int) -> int:
        """Give back what is still held under the claim (graceful stop)."""
        ...

    # -- raw ingestion -----------------------------------------------------------------

    async def read_outbox(self, after_seq: int, limit: int, upto_seq: int | None = None
                          ) -> list[OutboxEvent]:
        """Outbox events after ``after_seq`` (up to ``upto_seq``), in sequence order."""
        ...

    async def ingest(self, records: Sequence[NewRecord], source: tuple[str, int],
                     cursor: str | None, position: int | None, now_ms: int) -> int:
        """Write D1 records once each (a known key is left as it is), with ``source``
        (name, version) as their provenance, and move ``cursor`` forward to
        ``position`` (never back), in one transaction.  Returns how many were new."""
        ...

    async def cursor_position(self, cursor: str) -> int: ...

    async def outbox_last_seq(self) -> int: ...

    async def outbox_pending(self, after_seq: int, kinds: Sequence[str]) -> int:
        """Outbox events of ``kinds`` after ``after_seq`` that have no D1 record yet (the
        raw ingestion backlog, counted from the records, not from a cursor)."""
        ...

    async def raw_pending(self, kinds: Sequence[str]) -> int:
        """``outbox_pending(0, kinds)`` from counts kept by triggers (schema v14): the
        events of ``kinds`` the outbox keeps less those with a D1 record; a few small
        reads whatever the outbox's size (``status``, ``backlog``)."""
        ...

    async def outbox_first_pending(self, after_seq: int, kinds: Sequence[str]) -> int | None:
        """The lowest sequence of those events (None: there is none)."""
        ...

    # -- configuration, levels, funnel ---------------------------------------------------

    async def record_worker_config(self, view: WorkerConfigView) -> None: ...

    async def worker_configs(self) -> list[WorkerConfigView]: ...

    async def level_counts(self) -> LevelCounts: ...

    async def funnel(self) -> dict[str, dict[str, int]]:
        """D4: counted leads per form and latest observed status."""
        ...

    def iter_level(self, level: int) -> AsyncIterator[tuple[str, Mapping[str, Any], int]]:
        """``(key, payload, rev)`` of every record of a level, in key order."""
        ...

    def wakeups(self, stage: Stage) -> AbstractAsyncContextManager[Wakeups]:
        """Wake-ups for a consumer of ``stage`` (raw ingestion: new outbox events; the
        others: new or changed inputs).  SQLite: a plain poll interval."""
        ...

    # -- retention ---------------------------------------------------------------------

    async def prune_pipeline(self, before_ms: int, at: str, *, dry_run: bool = False,
                             batch: int | None = None) -> PipelinePrune:
        """Remove the finished per-event records, their work rows and histories, and the
        histories older than ``before_ms`` (``runner.pipeline.retention``); never a
        merged record, D4, an unfinished or backlogged input, or a D1 record whose
        outbox event is kept.  Rounds of at most ``batch`` records per level, each one
        recorded transaction; ``dry_run`` rolls every round back."""
        ...
