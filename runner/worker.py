"""The library API (SPEC L14): ``DurableWorker(db, scope, port)``.

The CLI is a thin shell over this class; a user can drive runner from their own code and
plug in their own target adapter::

    async with DurableWorker("/srv/leads/queue.db", scope, port) as worker:
        result = await worker.accept({"tenant_id": ..., "source_lead_id": ..., ...})
        summary = await worker.run_cycle()      # takes the worker lock for the cycle
        print(await worker.status())

``port`` is a :class:`runner.CRMRecordPort` around an adapter (a bare adapter is wrapped).
``target_rate`` (requests per second) paces the writes to the target (batch appends),
``target_read_rate`` its reads (readbacks, reconcile reads, status reads; None: reads
are not paced, only a ``RateLimited`` answer holds them); ``retry_base``
and ``retry_cap`` (seconds) set the backoff of records that were not sent (issue 16).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from runner.clock import Clock, SystemClock
from runner.errors import BadInputError, RuleViolation, UsageError
from runner.io.stores import open_store
from runner.leads.pacing import DEFAULT_RETRY_BASE, DEFAULT_RETRY_CAP, Backoff, Pacer
from runner.leads.port import CRMAdapter, CRMRecordPort, Missing
from runner.leads.states import LeadState
from runner.limits import BATCH_SIZE_RANGE, DEFAULT_BATCH_SIZE, UNCERTAIN_SHOWN
from runner.status import iter_record_json, record_state, status_document
from runner.storedata import GivenScope
from runner.tasks import deliver, poll, target
from runner.tasks.outcomes import CycleSummary
from runner.tasks.pagerun import SendGuard

if TYPE_CHECKING:  # the models and intake (pydantic) load when a record is taken in
    from runner.leads import intake
    from runner.leads.models import LeadEvent, Scope
    from runner.store import Store


def check_batch_size(batch_size: int) -> None:
    low, high = BATCH_SIZE_RANGE
    if not low <= batch_size <= high:
        raise UsageError(f"batch size must be between {low} and {high}")


class DurableWorker:
    """A durable inbox bound to one scope.  Open with ``async with``."""

    def __init__(
        self,
        db: str,
        scope: Scope | GivenScope | Mapping[str, Any],
        port: CRMRecordPort | CRMAdapter | None = None,
        *,
        clock: Clock | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        target_rate: float | None = None,
        target_read_rate: float | None = None,
        retry_base: float = DEFAULT_RETRY_BASE,
        retry_cap: float = DEFAULT_RETRY_CAP,
        dispatch_pipeline: bool | None = None,
    ) -> None:
        check_batch_size(batch_size)
        self.db = db
        #: records per target request in a dispatch (``run_cycle``, the loop)
        self.batch_size = batch_size
        #: whether a batched dispatch commits the next batch's mark beside the request of
        #: the batch before (issue 32; None: when the target deduplicates by write_id)
        self.dispatch_pipeline = dispatch_pipeline
        #: when a record that was not sent (failed_safe) is tried again (issue 16)
        self.backoff = Backoff(retry_base, retry_cap)
        #: a ``GivenScope`` stays as given until something needs it validated (``scope``):
        #: opening the store compares it with the pin first
        self._scope: Scope | GivenScope
        if isinstance(scope, GivenScope):
            self._scope = scope
        else:
            from runner.leads.models import Scope, validate_scope

            self._scope = scope if isinstance(scope, Scope) else validate_scope(dict(scope))
        if port is not None and not isinstance(port, CRMRecordPort):
            port = CRMRecordPort(port)
        if port is not None and target_rate is not None:
            # the write quota: every batch write takes a token
            port.pacer = Pacer(target_rate, default_hold=max(retry_base, 0.1))
        if port is not None and target_read_rate is not None:
            # the read quota: readbacks, reconcile reads and status reads, apart
            port.read_pacer = Pacer(target_read_rate, default_hold=max(retry_base, 0.1))
        self._port = port
        self.clock: Clock = clock or SystemClock()
        self._store: Store | None = None
        self._intake: intake.Intake | None = None
        self._locked = False
        #: the target passed the checks before work (and is pinned, if it can be)
        self._target_checked = False

    @property
    def scope(self) -> Scope:
        """The scope, validated (a ``GivenScope`` on first use)."""
        if isinstance(self._scope, GivenScope):
            self._scope = self._scope.validated()
        return self._scope

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UsageError("DurableWorker is not open; use 'async with DurableWorker(...)'")
        return self._store

    async def open(self) -> DurableWorker:
        if self._store is None:
            self._store = await open_store(self.db, scope=self._scope, create=True)
        return self

    async def aclose(self) -> None:
        self._target_checked = False
        if self._store is not None:
            store, self._store, self._intake = self._store, None, None
            await store.aclose()

    async def __aenter__(self) -> DurableWorker:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def accept(self, record: Mapping[str, Any] | LeadEvent) -> intake.AcceptResult:
        """Validate and durably accept one event; answers after the commit.  Concurrent
        callers share commits (group commit)."""
        return await self._open_intake().accept(record)

    async def accept_many(
        self, records: Sequence[Mapping[str, Any] | BadInputError]
    ) -> list[intake.AcceptResult]:
        """Accept a batch in one commit; answers in input order (bulk intake)."""
        return await self._open_intake().accept_batch(records)

    def _open_intake(self) -> intake.Intake:
        if self._intake is None:
            from runner.leads import intake

            self._intake = intake.Intake(self.store, self.clock, self.scope)
        return self._intake

    @property
    def port(self) -> CRMRecordPort:
        if self._port is None:
            raise UsageError("this DurableWorker has no port; pass one to deliver records")
        return self._port

    async def check_target(self) -> None:
        """The checks before work (``runner.tasks.target``): the target opens, can be
        written and is the store's own (pinned on first use).  Raises with an exit code
        (74 unavailable, 77 unsafe location, 78 another target) and changes nothing
        otherwise.  Done once per open worker: ``hold_lock`` calls it once the lock is
        held (a second worker is refused by the lock first, exit 75) and before recovery,
        so a bad target never even recovers a record."""
        if not self._target_checked:
            await target.check_for_writes(self.store, self.port, self.clock)
            self._target_checked = True

    @asynccontextmanager
    async def hold_lock(self) -> AsyncIterator[int]:
        """Hold the worker lock (L7); on acquiring it the target is checked (if this
        worker has a port), then every in-flight record becomes uncertain.  Yields how
        many were recovered.  Raises LockHeld (exit 75) at once if another live worker
        holds it."""
        if self._locked:
            yield 0
            return
        check = not self._target_checked and self._port is not None
        async with deliver.holding_lock(self.store, self._port, self.clock,
                                        check_target=check) as recovered:
            self._target_checked = self._target_checked or check
            self._locked = True
            try:
                yield recovered
            finally:
                self._locked = False

    async def run_cycle(
        self,
        *,
        dispatch_limit: int | None = None,
        guard: SendGuard | None = None,
        summary: CycleSummary | None = None,
        batch_size: int | None = None,
    ) -> CycleSummary:
        """One cycle: reconcile -> dispatch (L8), under the worker lock (taken for the
        cycle unless ``hold_lock`` holds it: taking it recovers in-flight records).
        ``batch_size``: records per target request (default: the worker's; 1 sends one
        record per request; a target that cannot batch is sent one at a time)."""
        if batch_size is not None:
            check_batch_size(batch_size)
        summary = summary if summary is not None else CycleSummary()
        async with self.hold_lock() as recovered:
            summary.recovered += recovered
            await deliver.run_cycle(self.store, self.port, self.clock, guard=guard,
                                    dispatch_limit=dispatch_limit, summary=summary,
                                    batch_size=batch_size or self.batch_size,
                                    backoff=self.backoff,
                                    pipeline=self.dispatch_pipeline)
        return summary

    async def poll(self, limit: int = poll.DEFAULT_POLL_LIMIT) -> poll.PollSummary:
        """One bounded, fair status poll pass over confirmed records (L12).  Takes no lock:
        observations never risk a duplicate write.  Never creates a target: one that is
        absent, unreadable or not the pinned one fails every read of the pass."""
        low, high = poll.POLL_LIMIT_RANGE
        if not low <= limit <= high:
            raise UsageError(f"poll limit must be between {low} and {high}")
        check = target.TRUSTED if self._target_checked else None
        return await poll.poll_pass(self.store, self.port, self.clock, limit, check)

    async def observe(
        self, record: Mapping[str, Any] | LeadEvent, snapshot: Mapping[str, Any]
    ) -> str:
        """Store the latest status observation of a confirmed record (L11).  Returns
        ``changed``, ``unchanged`` or ``missing``; refuses records that are not confirmed."""
        from runner.leads import intake

        event, _ = intake.prepare(record, self.scope)
        seen = poll.snapshot_from_json(snapshot)
        row = await self.store.find_lead(event.tenant_id, event.source_lead_id)
        if row is None:
            raise RuleViolation("no accepted record with this key", reason="unknown_record")
        if row.state is LeadState.CONFIRMED_THEN_MISSING and isinstance(seen, Missing):
            return "missing"
        if row.state is not LeadState.CONFIRMED:
            raise RuleViolation(
                f"only confirmed records are observed; this one is {row.state.value}",
                reason="not_confirmed")
        current = await self.store.lead_snapshot(row.write_id)
        write = poll.decide(row.write_id, current[1] if current else None, seen)
        await self.store.apply_observations([write], self.clock.now())
        return write.outcome

    async def status(self, *, shown: int = UNCERTAIN_SHOWN) -> dict[str, Any]:
        """The status document of SPEC L13: counts, health and the oldest ``shown``
        uncertain records (``uncertain``: ``total``, ``truncated``, ``records``).  Its
        size does not grow with the store; every record is ``records()``."""
        return await status_document(self.store, shown=shown)

    def records(self, state: LeadState | str | None = None
                ) -> AsyncGenerator[dict[str, Any], None]:
        """Every record (or those in ``state``) in accept order, one document at a time,
        from one consistent read, read page by page (constant memory)::

            async for record in worker.records():
                ...

        Leaving the loop early holds the read open until the generator is closed:
        ``async with contextlib.aclosing(worker.records()) as records``."""
        return iter_record_json(self.store, state=record_state(state))
