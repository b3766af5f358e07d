"""The Store port: domain operations, not SQL (ARCHITECTURE idea 1 and 3).

The store is the truth.  Every operation here is one transaction, and every state change
commits together with its outbox event (K3).  Tasks and the worker only ever talk to this
protocol; SQLite (``runner.io.sqlite``) and PostgreSQL adapters implement it, and
backend-specific SQL stays inside them.

``runner.io.stores.open_store`` picks the adapter from the location (a ``postgresql://``
DSN or a file path): composition happens at the edge.  The plain data the operations take
and return live in the light ``runner.storedata`` (re-exported here); this module adds the
protocol itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from runner.candidates.port import CandidateStore
from runner.ids import WriteId
from runner.leads.states import LeadState
from runner.pipeline.port import PipelineStore
from runner.retention import RetentionStore
from runner.storedata import (
    AcceptItem,
    AcceptOutcome,
    AcceptResultKind,
    Decision,
    DecisionBatch,
    LeadRow,
    LeadWork,
    ObservationOutcome,
    ObservationWrite,
    PollTarget,
    Requeue,
    ResolveSubject,
    ScopeData,
    StoreSummary,
    UncertainRow,
    check_scope,
    is_postgres,
)

if TYPE_CHECKING:
    from runner.figures import LeadFigures
    from runner.io.engine.marks import StoreMark
    from runner.leads.models import LeadEvent, Scope
    from runner.replication import Replication

__all__ = [
    "AcceptItem",
    "AcceptOutcome",
    "AcceptResultKind",
    "Decision",
    "DecisionBatch",
    "DeliveryStore",
    "DispatchSteps",
    "IntakeStore",
    "LeadRow",
    "LeadWork",
    "ObservationOutcome",
    "ObservationWrite",
    "OperatorStore",
    "PollStore",
    "PollTarget",
    "Reconnecting",
    "Requeue",
    "ResolveSubject",
    "ScopeData",
    "StatusReader",
    "Store",
    "StoreSummary",
    "TargetPins",
    "UncertainRow",
    "WorkerLock",
    "check_scope",
    "is_postgres",
]


class DispatchSteps(Protocol):
    """The store calls of a dispatch run, made from the one worker thread that runs it.

    Dispatch runs a page of records in one thread (commit, send, commit, send …), so that a
    record costs no hop between the event loop and a thread; these are the same
    transitions as the Store's async methods, blocking.  SQLite makes them on a connection
    of their own; other stores bridge back to their async methods on the event loop
    (:class:`runner.io.engine.delivery.LoopDispatchSteps`)."""

    def finish_and_mark(
        self, done: tuple[WriteId, LeadState] | None, next_write_id: WriteId, now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> int | None:
        """As :meth:`Store.finish_and_mark` (``done`` None: only the mark)."""
        ...

    def finish_and_mark_batch(
        self, done: Sequence[tuple[WriteId, LeadState]], next_ids: Sequence[WriteId],
        now: datetime, retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        """As :meth:`Store.finish_and_mark_batch`."""
        ...

    def mark_batch(
        self, done: Sequence[tuple[WriteId, LeadState]], next_ids: Sequence[WriteId],
        now: datetime, retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]:
        """As :meth:`finish_and_mark_batch`, and the seq the marked batch carries to a
        target that keeps marks (SPEC E8), in the same transaction (0: none marked)."""
        ...

    def take_landed(self) -> Sequence[tuple[WriteId, LeadState]]:
        """The outcomes the last step, which failed, committed all the same (its outcomes'
        transaction beside a failed mark), once; empty where a step is one transaction."""
        ...


class MarkStore(Protocol):
    """The store's mark and its rewinds (SPEC E8, v18; ``runner.tasks.rewind``)."""

    async def store_mark(self) -> StoreMark:
        """The store's identity, epoch and counter, and its pending rewind."""
        ...

    async def begin_epoch(self, min_epoch: int, reason: str | None, now: datetime, *,
                          tag: bool, until: datetime | None = None) -> StoreMark:
        """A new epoch above ``min_epoch``; with ``tag``, every record a forgotten
        history could have sent becomes uncertain, tagged ``rewound``."""
        ...

    async def begin_fenced_epoch(self, epoch: int, reason: str | None, now: datetime, *,
                                 until: datetime) -> StoreMark:
        """The epoch whose fence the target holds now (with ``reason``: a rewind's tags),
        and that it stands, in one transaction."""
        ...

    async def key_check(self, reason: str, now: datetime) -> int:
        """Prepared and failed_safe records become uncertain, tagged ``rewound`` (read
        back by key before they are sent); how many."""
        ...

    async def rewound_page(self, after_seq: int, limit: int) -> Sequence[Any]:
        """Rewound records still to read (rows as ``uncertain_page``'s)."""
        ...

    async def rewound_untag(self, verdicts: Sequence[tuple[WriteId, str]],
                            now: datetime) -> None:
        """Rewound records left uncertain by their readback: ordinary uncertain ones."""
        ...

    async def adopt_write_ids(self, pairs: Sequence[tuple[WriteId, str]],
                              now: datetime) -> list[WriteId]:
        """Rewound records take the write_ids the target holds them under."""
        ...

    async def rewind_done(self, now: datetime) -> bool:
        """End the pending rewind once no rewound record is left unread."""
        ...

    async def adopt_target(self, previous_owner: str, target_id: str | None, reason: str,
                           now: datetime) -> None:
        """Record an operator's decision that this store replaces the target's owner."""
        ...

    async def server_timeline(self) -> int | None:
        """The PostgreSQL server's timeline (None: a store without one)."""
        ...

    async def record_timeline(self, timeline: int, replication: str, now: datetime) -> None:
        """Record the server's timeline and replication mode at a start under the lock."""
        ...

    async def replication(self) -> Replication:
        """The replication guarantee the store runs under (``runner.replication``)."""
        ...


class IntakeStore(Protocol):
    """What durable intake needs (``runner.leads.intake``, L3)."""

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        """Insert the event if its key is new (with an ``accepted`` outbox event), else
        say ``duplicate`` (same canonical JSON) or ``conflict``; commits before returning.
        """
        ...

    async def accept_many(
        self, items: Sequence[AcceptItem], now: datetime
    ) -> list[AcceptOutcome]:
        """Accept several events in one transaction (group commit); the outcomes, in
        order, are exactly those of accepting them one by one in that order (a key that
        appears twice: the first is accepted, the second is a duplicate or a conflict)."""
        ...


class TargetPins(Protocol):
    """The target pinned into the store (L9): what the checks before work need
    (``runner.tasks.target``)."""

    async def pinned_target(self) -> str | None:
        """The identity of the target pinned into the store (L9), None before the first
        delivery run pins one."""
        ...

    async def pin_target(self, target_id: str, now: datetime) -> str:
        """Pin ``target_id`` if the store has no target pinned yet; returns the pinned
        identity (the caller refuses a different one).  A pin is never changed."""
        ...

    async def poll_page(self, limit: int) -> list[PollTarget]: ...

    async def summary(self) -> StoreSummary: ...


class WorkerLock(Protocol):
    """The worker lock (L7) while it is held: a ``flock`` is held until the process lets
    go; a PostgreSQL advisory lock is held by a session, which a server restart, a
    failover or a network fault can end under the holder (issue 30)."""

    @property
    def lost(self) -> bool:
        """The lock's session ended under us: no in-flight mark passes its fence."""
        ...

    async def wait_lost(self) -> None:
        """Until the lock is lost (never, for a file lock)."""
        ...

    async def regain(self) -> bool:
        """After the store reconnected: True if the lock is still held (its session on
        the server the store's session reaches); else it is taken anew (False: records
        in flight must be recovered).  Raises ``LockHeld`` (exit 75) when another worker
        took it meanwhile."""
        ...


class Reconnecting(Protocol):
    """A store whose session can be lost and opened again (``StoreUnavailable``)."""

    async def reconnect(self) -> None:
        """Open the store's session anew, in place, checked to reach the same store
        (never creating one); ``StoreUnavailable`` while the server cannot be reached.
        A SQLite store has nothing to reconnect."""
        ...


class DeliveryStore(TargetPins, Reconnecting, MarkStore, Protocol):
    """What a delivery cycle needs (``runner.tasks.deliver``, L4-L8): the worker lock,
    recovery, reconcile and the send transitions."""

    def worker_lock(self) -> AbstractAsyncContextManager[WorkerLock]:
        """The lock that keeps a second worker out (L7): a ``flock`` file beside a SQLite
        store, a session advisory lock on PostgreSQL.  Entering it raises ``LockHeld``
        (exit 75) at once if another live worker holds it; it is released when the holder
        exits or dies."""
        ...

    # -- delivery (L4-L8): every method is one transaction; transitions are guarded by
    # -- the current state, so a stale caller changes nothing instead of the wrong thing

    async def recover_in_flight(self, now: datetime) -> list[str]:
        """Every in_flight record becomes uncertain (with its event); returns their keys."""
        ...

    async def uncertain_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        """Uncertain records after ``after_seq``, in accept order."""
        ...

    async def reconcile_order(self) -> list[int]:
        """The seqs of every uncertain record, oldest reconcile attempt first (never read
        back first), then in accept order: a reconcile pass's keys (issue 16)."""
        ...

    async def uncertain_by_seqs(self, seqs: Sequence[int]) -> list[LeadWork]:
        """The records among ``seqs`` that are still uncertain, in the order given."""
        ...

    async def lead_states(self, write_ids: Sequence[WriteId]) -> dict[WriteId, LeadState]:
        """The state of each record among ``write_ids`` that the store holds."""
        ...

    async def dispatchable_page(
        self, after_seq: int, limit: int, now: datetime | None = None
    ) -> list[LeadWork]:
        """Prepared records, and failed_safe ones due at ``now`` (their backoff is over;
        None: every failed_safe record), after ``after_seq``, in accept order."""
        ...

    async def finish_send(self, write_id: WriteId, outcome: LeadState, now: datetime,
                          retry_at: datetime | None = None,
                          reason: str | None = None,
                          failure: str | None = None) -> None:
        """in_flight -> ``outcome`` (confirmed, failed_safe or uncertain); a failed_safe
        outcome is due again at ``retry_at`` (None: at once), with the target's ``reason``
        for refusing it kept as its ``last_error`` (v13; None: none; every other state
        change clears it)."""
        ...

    async def finish_and_mark(
        self,
        done: tuple[WriteId, LeadState] | None,
        next_write_id: WriteId,
        now: datetime,
        retry_at: datetime | None = None,
        reason: str | None = None,
        failure: str | None = None,
    ) -> int | None:
        """In one transaction: ``done``'s in_flight -> its outcome (as ``finish_send``,
        with its ``retry_at``), and ``next_write_id`` -> in_flight with ``attempts + 1``
        (``done`` None: only the mark).
        Returns the next record's attempts, or None if it is no longer dispatchable (the
        outcome is committed either way).  On PostgreSQL with the worker lock held, a lock
        whose session has ended raises ``LockLost`` and changes nothing."""
        ...

    async def finish_and_mark_batch(
        self,
        done: Sequence[tuple[WriteId, LeadState]],
        next_ids: Sequence[WriteId],
        now: datetime,
        retry_at: datetime | None = None,
        reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        """A batch's step (issue 16), in one transaction: every ``done`` record's in_flight
        -> its outcome (failed_safe ones due again at ``retry_at``), and every ``next_ids``
        record -> in_flight with ``attempts + 1``.
        Returns the new attempts of the next records that were marked (one missing is no
        longer dispatchable); raises IllegalTransition if a ``done`` record was not in
        flight.  With ``next_ids``, fenced on PostgreSQL as ``finish_and_mark``."""
        ...

    async def uncertain_count(self) -> int:
        """How many records are uncertain now."""
        ...

    def dispatch_steps(self) -> AbstractAsyncContextManager[DispatchSteps]:
        """Blocking :class:`DispatchSteps` for one dispatch run's worker thread, open for
        the run.  The steps are called from that thread only, never from the event loop."""
        ...

    async def record_reconcile(
        self, write_id: WriteId, *, confirmed: bool, note: str | None, now: datetime,
        outcome: str | None = None,
    ) -> None:
        """Count a reconcile attempt of an uncertain record; ``confirmed`` moves it to
        confirmed.  A new non-empty ``note`` (``ambiguous``, ``mismatch``) writes one
        ``target_ambiguous`` outbox event.  ``outcome``, the readback's verdict (``none``,
        ``ambiguous``, ``mismatch``, ``read_failed``), is kept as the record's last
        reconcile verdict (``runner uncertain`` says it in words)."""
        ...

    async def record_reconcile_batch(
        self, verdicts: Sequence[tuple[WriteId, str | None, str | None]], now: datetime,
        requeue: Requeue | None = None,
    ) -> set[WriteId]:
        """:meth:`record_reconcile` for many records in one transaction: per record
        ``(write_id, outcome, note)``, ``outcome`` None for a matching readback
        (confirmed); and, in the same transaction, the records of ``requeue`` authorised
        for a resend (SPEC E7: see :class:`Requeue`).  Returns the write_ids that were
        still uncertain (changed)."""
        ...


class OperatorStore(Protocol):
    """What an operator's commands need (E5): list and resolve uncertain records."""

    async def uncertain_records(self, after_seq: int, limit: int) -> list[UncertainRow]:
        """Uncertain records after ``after_seq``, in accept order, with when they became
        uncertain and their last reconcile verdict."""
        ...

    async def resolve_subject(self, write_id: WriteId) -> ResolveSubject | None:
        """The record with this write_id (state, event, attempts), or None."""
        ...

    async def record_operator_decision(self, decision: Decision, now: datetime) -> None:
        """In one transaction: keep the decision (its ``operator_resolved`` event carries
        the reason) and move the record from uncertain to ``decision.to_state``, guarded
        by its state and ``attempts``.  Raises IllegalTransition, having changed nothing,
        if the record is no longer uncertain at those attempts."""
        ...

    async def resolve_page(self, after_seq: int, limit: int, *,
                           in_flight: bool = False) -> list[ResolveSubject]:
        """Up to ``limit`` uncertain records after ``after_seq``, in accept order, as
        ``resolve_subject`` gives them (``runner resolve --all`` pages through them);
        ``in_flight``: in_flight records too (a dry run's view of what recovery would
        make uncertain)."""
        ...

    async def record_operator_decisions(self, batch: DecisionBatch, now: datetime
                                        ) -> set[WriteId]:
        """``record_operator_decision`` for a chunk, in one transaction, set-based: for
        every record of ``batch`` still uncertain at its attempts, one decision row (with
        its ``operator_resolved`` event) and the move to ``batch.to_state`` (with its
        ``state_changed`` event).  Returns the write_ids decided; a record no longer
        uncertain at its attempts is left unchanged (and not returned)."""
        ...

    async def recover_in_flight(self, now: datetime) -> list[str]:
        """As ``DeliveryStore.recover_in_flight``: a holder of the worker lock makes every
        in_flight record uncertain (L7); ``resolve --all`` takes the lock, so it does."""
        ...

    async def uncertain_count(self) -> int:
        """How many records are uncertain now."""
        ...


class PollStore(TargetPins, Protocol):
    """What the poll pass and ``observe`` need (L11, L12): a pass reads only the pinned
    target (``runner.tasks.target.check_for_reads``)."""

    async def poll_page(self, limit: int) -> list[PollTarget]:
        """Up to ``limit`` confirmed records, oldest poll first (never polled first, then
        accept order)."""
        ...

    async def find_lead(self, tenant_id: str, source_lead_id: str) -> LeadRow | None: ...

    async def lead_snapshot(self, write_id: WriteId) -> tuple[LeadState, str | None] | None:
        """A record's state and its last snapshot (canonical JSON), or None if unknown."""
        ...

    async def apply_observations(self, writes: Sequence[ObservationWrite], now: datetime) -> int:
        """Store a pass's observations in one transaction; only confirmed records change.
        Returns how many snapshots really changed (each wrote one event)."""
        ...

    async def record_poll_pass(
        self, writes: Sequence[ObservationWrite], failure: str | None, now: datetime
    ) -> tuple[int, bool]:
        """``apply_observations`` and the pass's poll health in one transaction (one
        commit per poll pass); returns (snapshots changed, health event written).

        ``failure`` is the pass's read failure, or ``None`` for a healthy pass.  A failure
        that differs from the open run starts a new run with one ``poll_health`` event; the
        same failure only extends the run; a healthy pass closes it.  Safe across
        processes."""
        ...


class StatusReader(Protocol):
    """What ``status`` and ``/metrics`` read."""

    def reading(self) -> AbstractAsyncContextManager[None]:
        """A consistent read view: ``summary()`` and ``iter_records()`` inside it see one
        snapshot of the store (a read transaction)."""
        ...

    async def summary(self) -> StoreSummary:
        """Counts, outbox figures and poll health, from one consistent read: the counts
        per state and per outbox kind are kept by triggers, so this costs a few small
        reads whatever the store's size."""
        ...

    async def lead_figures(self) -> LeadFigures:
        """Counts by state (kept by triggers), the oldest uncertain record and the open
        poll-health run: a few small reads whatever the store's size (``/metrics``)."""
        ...

    def iter_records(self, *, state: LeadState | None = None, page: int = 1000
                     ) -> AsyncGenerator[LeadRow, None]:
        """Every lead record (or those in ``state``) in accept order, streamed in pages
        of ``page`` (never all in memory at once)."""
        ...

    async def replication(self) -> Replication:
        """The replication guarantee the store runs under now (``runner.replication``):
        one small read, outside any snapshot; SQLite: a single file."""
        ...


class Store(IntakeStore, DeliveryStore, OperatorStore, PollStore, StatusReader,
            CandidateStore, PipelineStore, RetentionStore, Protocol):
    """A durable store: every role port at once.  Use as ``async with await
    open_store(...) as store`` (``runner.io.stores``).  A task asks for the narrowest port
    it needs; the candidate lifecycle operations (SPEC C) come from ``CandidateStore``, the
    staged processing operations (SPEC P) from ``PipelineStore``."""

    backend: str

    @property
    def scope(self) -> Scope | None:
        """The scope pinned into the store, if any command has pinned one."""
        ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Store: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
