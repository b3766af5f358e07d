"""The write/reconcile cycle (SPEC L5-L8): recover, reconcile every uncertain record, then
dispatch prepared and failed-safe records in accept order.

The recovery policy of this work is *mark uncertain and reconcile only* (K5): an external
write whose outcome is unknown is never retried.  The whole file is built around three
rules:

1. The in-flight mark (and ``attempts + 1``) commits before the target is called, so a
   crash at any later point leaves evidence that a send may have happened.
2. Only ``BeforeWriteError`` makes a record failed-safe (sendable again).  Any other
   exception, a timeout, a cancellation or an incomplete readback makes it uncertain.
3. Uncertain records are only read back, never sent.  Dispatch starts only after every
   reconcile call of the cycle has returned.

Cancellation is never swallowed: a cancelled send records ``uncertain`` in a short
shielded window and re-raises.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

import anyio

from runner import crashpoints
from runner.clock import Clock
from runner.errors import StoreError
from runner.leads.port import CRMRecordPort, readback_in_words
from runner.leads.states import IllegalTransition, LeadState
from runner.store import DeliveryStore, DispatchSteps, LeadWork
from runner.tasks import target

log = logging.getLogger("runner.deliver")

PAGE = 200
#: how long a cancelled send may take to record its outcome before giving up (the
#: record then stays in_flight and the next start makes it uncertain)
RECORD_WINDOW = 2.0


@dataclass
class CycleSummary:
    """What one cycle did (L13): counts of transitions made by this cycle, and of its poll
    pass: ``polled`` records read, ``poll_failed`` of them whose read failed (all of them:
    the pass read nothing).  A send's outcome is counted when it is committed, so a send
    that a hard stop records uncertain counts as ``uncertain``.  ``still_uncertain``: how
    many records were uncertain when the cycle ended (None: it could not be read)."""

    recovered: int = 0
    reconciled: int = 0
    dispatched: int = 0
    confirmed: int = 0
    failed_safe: int = 0
    uncertain: int = 0
    polled: int = 0
    poll_failed: int = 0
    still_uncertain: int | None = None

    @property
    def moved(self) -> int:
        """How many record transitions the cycle made (the poll pass's aside)."""
        return (self.recovered + self.reconciled + self.dispatched + self.confirmed
                + self.failed_safe + self.uncertain)

    def to_json(self) -> dict[str, int | None]:
        return asdict(self)


class SendGuard(Protocol):
    """How the runner loop shields sends and stops taking new work (K4)."""

    @property
    def stopping(self) -> bool:
        """True once no new send may start."""
        ...

    def shield(self) -> AbstractContextManager[anyio.CancelScope]:
        """A scope a send runs in: shielded from a graceful stop, cancelled by a hard one."""
        ...


class NoGuard:
    """For one-shot runs: never stopping; sends are not shielded."""

    stopping = False

    @contextmanager
    def shield(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            yield scope


async def recover(store: DeliveryStore, clock: Clock) -> int:
    crashpoints.hit("recover.before-commit")
    keys = await store.recover_in_flight(clock.now())
    crashpoints.hit("recover.after-commit")
    for key in keys:
        log.warning("in flight at start: now uncertain (reconcile only, never resent)",
                    extra={"action": "lead.recovered", "key": key, "to_state": "uncertain"})
    return len(keys)


async def reconcile_all(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, guard: SendGuard | None = None
) -> int:
    """Read back every uncertain record once; returns how many were confirmed."""
    confirmed, after = 0, 0
    while page := await store.uncertain_page(after, PAGE):
        for work in page:
            if guard is not None and guard.stopping:
                return confirmed
            after = work.seq
            confirmed += await reconcile_one(store, port, clock, work)
    return confirmed


async def reconcile_one(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, work: LeadWork
) -> int:
    try:
        verdict: str = await port.confirm(work.event, work.write_id)
    except Exception as exc:  # noqa: BLE001 - a failed read proves nothing either way (L6)
        verdict = "read_failed"
        log.warning("readback failed: %s", type(exc).__name__,
                    extra={"action": "lead.reconcile_failed", "key": work.source_lead_id})
    ok = verdict == "match"
    note = verdict if verdict in ("ambiguous", "mismatch") else None
    crashpoints.hit("reconcile.before-commit")
    await store.record_reconcile(work.write_id, confirmed=ok, note=note, now=clock.now(),
                                 outcome=None if ok else verdict)
    crashpoints.hit("reconcile.after-commit")
    if ok:
        log.info("confirmed by readback", extra={
            "action": "lead.reconciled", "key": work.source_lead_id,
            "from_state": "uncertain", "to_state": "confirmed"})
    else:
        log.warning("still uncertain: %s", readback_in_words(verdict),
                    extra={"action": "lead.still_uncertain", "key": work.source_lead_id,
                           "reason": verdict})
    return int(ok)


async def dispatch_all(
    store: DeliveryStore,
    port: CRMRecordPort,
    clock: Clock,
    summary: CycleSummary,
    *,
    guard: SendGuard,
    limit: int | None = None,
    batch_size: int = 1,
) -> None:
    """Send prepared and failed-safe records in accept order, each at most once here.

    Two commits per record instead of three: a send's outcome is committed in the same
    statement as the next record's in-flight mark.  Every guarantee holds: the in-flight
    mark still commits before its send, and an outcome not yet committed when the process
    dies leaves its record in flight, which the next start makes uncertain and reconciles
    (a confirmed one is read back and confirmed again, never resent).

    With ``batch_size`` above 1 and a port that batches (``CRMRecordPort.batches``), the
    same holds for a batch of records at a time (:class:`_BatchRun`): one commit marks the
    whole batch in flight, one request sends it, one readback reads every row of it, and
    one commit records every outcome together with the next batch's mark.

    Each page of records runs in one worker thread (:class:`_PageRun`): commit, send,
    commit, send, with no hop to the event loop in between, which would cost more than
    the commit.  The page runs in the guard's shield: a graceful stop lets the send in
    flight finish and starts no other; a hard stop abandons the thread (which then sends
    nothing more) and the records in flight are recorded uncertain.  The last outcomes are
    committed on the way out, also after a stop (then within a short shielded window).
    """
    batch = batch_size if port.batches else 1
    size = max(PAGE, batch)
    after = 0
    page = await store.dispatchable_page(after, size) if not guard.stopping else []
    if not page:
        return
    pending: list[Pending] = []  # outcomes not yet committed
    try:
        async with store.dispatch_steps() as steps:
            while page:
                run: _PageRun | _BatchRun = (
                    _PageRun(steps, port, clock, summary, guard, limit, page, pending)
                    if batch == 1 else
                    _BatchRun(steps, port, clock, summary, guard, limit, page, pending, batch))
                try:
                    with guard.shield():
                        await anyio.to_thread.run_sync(run.run, abandon_on_cancel=True)
                finally:
                    pending = run.take_over()
                if run.ended or guard.stopping:
                    return
                after = page[-1].seq
                page = await store.dispatchable_page(after, size)
    finally:
        if pending:
            # recorded whatever happened; after a cancellation only within a short window
            with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_WINDOW):
                await _record_last(store, clock, summary, pending)


async def _record_last(
    store: DeliveryStore, clock: Clock, summary: CycleSummary, pending: list[Pending]
) -> None:
    """Commit the outcomes of the last send of a dispatch run."""
    crashpoints.hit("dispatch.before-confirm")
    try:
        if len(pending) == 1:
            await store.finish_send(pending[0][0].write_id, pending[0][1], clock.now())
        else:
            await store.finish_and_mark_batch(
                [(work.write_id, outcome) for work, outcome in pending], [], clock.now())
    except IllegalTransition:
        # no longer in flight: the combined statement that marks the next record committed
        # these outcomes, then failed or was cancelled before it answered; the error on its
        # way out is the one to report
        return
    crashpoints.hit("dispatch.after-confirm")
    _counted(summary, pending)


#: a sent record and its outcome, not committed yet (uncertain until the send says more)
Pending = tuple[LeadWork, LeadState]


class _PageRun:
    """One page of dispatch in one worker thread.

    For each record: commit the previous record's outcome together with this record's
    in-flight mark (``DispatchSteps.finish_and_mark``), then send.  Before each record the
    thread checks the guard (a graceful stop, the dispatch limit).  The event loop only
    waits; when the wait ends — the page is done, it failed, or a hard stop abandoned the
    thread — :meth:`take_over` stops the thread before its next step and hands the loop
    the outcome not yet committed.  An abandoned thread never starts another commit or
    send; one already under way finishes, and every transition is guarded by the state it
    expects, so a late one changes nothing the loop has recorded.
    """

    def __init__(self, steps: DispatchSteps, port: CRMRecordPort, clock: Clock,
                 summary: CycleSummary, guard: SendGuard, limit: int | None,
                 page: list[LeadWork], pending: list[Pending]) -> None:
        self.steps, self.port, self.clock, self.summary = steps, port, clock, summary
        self.guard, self.limit, self.page = guard, limit, page
        self.ended = False  # stopped or at the limit: no next page
        self._pending: list[Pending] = pending
        self._abandoned = False
        self._lock = threading.Lock()  # held only to read or set the two fields above

    def take_over(self) -> list[Pending]:
        with self._lock:
            self._abandoned = True
            return self._pending

    def _go_on(self, pending: list[Pending]) -> bool:
        """Set what the loop must record if the run ends here; False once abandoned (the
        loop has then taken over what was pending before)."""
        with self._lock:
            self._pending = pending
            return not self._abandoned

    def _room(self) -> int:
        """How many more records may be sent (0: stop here)."""
        if self.guard.stopping:
            return 0
        if self.limit is None:
            return len(self.page)
        return max(self.limit - self.summary.dispatched, 0)

    def _committed(self, pending: list[Pending]) -> None:
        """The outcomes of ``pending`` are committed: count and log them."""
        if pending:
            crashpoints.hit("dispatch.after-confirm")
        _counted(self.summary, pending)

    def run(self) -> None:
        summary = self.summary
        for work in self.page:
            if not self._room():
                self.ended = True
                return
            with self._lock:
                if self._abandoned:
                    return
                pending = self._pending
            done = (pending[0][0].write_id, pending[0][1]) if pending else None
            if done is not None:
                crashpoints.hit("dispatch.before-confirm")
            attempts = self.steps.finish_and_mark(done, work.write_id, self.clock.now())
            # the previous outcome is in; this record is in flight (uncertain until its
            # send says more)
            self._go_on([(work, LeadState.UNCERTAIN)] if attempts is not None else [])
            self._committed(pending)
            if attempts is None:
                continue  # no longer dispatchable: someone else's state
            crashpoints.hit("dispatch.after-in-flight")
            summary.dispatched += 1
            with self._lock:  # the last moment a hard stop keeps this send from starting
                if self._abandoned:
                    return
            log.info("sending", extra={"action": "lead.in_flight", "key": work.source_lead_id,
                                       "attempts": attempts})
            outcome = _attempt(self.port, work)
            if not self._go_on([(work, outcome)]):
                return  # abandoned while out: the loop has recorded it uncertain


class _BatchRun(_PageRun):
    """One page of batched dispatch in one worker thread (issue 16): as :class:`_PageRun`,
    a batch of up to ``batch`` records at a time.

    For each batch: commit the previous batch's outcomes together with this batch's
    in-flight mark (``DispatchSteps.finish_and_mark_batch``: on PostgreSQL fenced by the
    worker lock), then one request (``CRMRecordPort.send_batch_blocking``: the batch write
    and the exact readback of every row of it).  Each record's outcome is its own: a
    ``BeforeWriteError`` makes the whole batch failed-safe, any other failure or an
    incomplete answer leaves every record not proven by its readback uncertain.
    """

    def __init__(self, steps: DispatchSteps, port: CRMRecordPort, clock: Clock,
                 summary: CycleSummary, guard: SendGuard, limit: int | None,
                 page: list[LeadWork], pending: list[Pending], batch: int) -> None:
        super().__init__(steps, port, clock, summary, guard, limit, page, pending)
        self.batch = batch

    def run(self) -> None:
        summary = self.summary
        start = 0
        while start < len(self.page):
            room = self._room()
            if not room:
                self.ended = True
                return
            chunk = self.page[start : start + min(self.batch, room)]
            start += len(chunk)
            with self._lock:
                if self._abandoned:
                    return
                pending = self._pending
            if pending:
                crashpoints.hit("dispatch.before-confirm")
            marked = self.steps.finish_and_mark_batch(
                [(work.write_id, outcome) for work, outcome in pending],
                [work.write_id for work in chunk], self.clock.now())
            sent = [work for work in chunk if work.write_id in marked]
            # the previous outcomes are in; this batch is in flight (uncertain until the
            # request says more)
            self._go_on([(work, LeadState.UNCERTAIN) for work in sent])
            self._committed(pending)
            if not sent:
                continue  # none dispatchable any more: someone else's state
            crashpoints.hit("dispatch.after-in-flight")
            summary.dispatched += len(sent)
            with self._lock:  # the last moment a hard stop keeps this send from starting
                if self._abandoned:
                    return
            if len(sent) == 1:  # the line of a single send
                log.info("sending", extra={"action": "lead.in_flight",
                                           "key": sent[0].source_lead_id,
                                           "attempts": marked[sent[0].write_id]})
            else:  # one line for the batch: a line per record costs more than its commit
                log.info("sending a batch of %d", len(sent), extra={
                    "action": "batch.in_flight", "count": len(sent),
                    "keys": [work.source_lead_id for work in sent]})
            outcomes = _attempt_batch(self.port, sent)
            if not self._go_on(list(zip(sent, outcomes, strict=True))):
                return  # abandoned while out: the loop has recorded them uncertain


def _count(summary: CycleSummary, outcome: LeadState) -> None:
    if outcome is LeadState.CONFIRMED:
        summary.confirmed += 1
    elif outcome is LeadState.FAILED_SAFE:
        summary.failed_safe += 1
    else:
        summary.uncertain += 1


def _attempt(port: CRMRecordPort, work: LeadWork) -> LeadState:
    """One send (L5): only a typed "not sent" is failed-safe, only an exact readback is
    confirmed; everything else — another error, a failed or inexact readback — is
    uncertain.  Blocking, in the page's thread: a hard stop abandons it (the loop records
    uncertain)."""
    result = port.send_blocking(work.event, work.write_id)
    if result.verdict == "not_sent":
        return LeadState.FAILED_SAFE
    if result.verdict == "match":
        return LeadState.CONFIRMED
    if result.error is not None:
        log.warning("send %s: %s", result.verdict, result.error, extra={
            "action": "lead.send_failed", "key": work.source_lead_id, "error": result.error})
    return LeadState.UNCERTAIN


def _attempt_batch(port: CRMRecordPort, batch: list[LeadWork]) -> list[LeadState]:
    """One batch request: each record's outcome by the rules of :func:`_attempt`."""
    results = port.send_batch_blocking([(work.event, work.write_id) for work in batch])
    outcomes = []
    for work, result in zip(batch, results, strict=True):
        if result.verdict == "not_sent":
            outcomes.append(LeadState.FAILED_SAFE)
        elif result.verdict == "match":
            outcomes.append(LeadState.CONFIRMED)
        else:
            if result.error is not None:
                log.warning("send %s: %s", result.verdict, result.error, extra={
                    "action": "lead.send_failed", "key": work.source_lead_id,
                    "error": result.error})
            outcomes.append(LeadState.UNCERTAIN)
    return outcomes


def _counted(summary: CycleSummary, pending: list[Pending]) -> None:
    """Count and log outcomes just committed.  A batch's confirmations are one line (the
    keys listed): a line per record costs more than its commit does; every other outcome
    is a line of its own, as it needs a look."""
    for _, outcome in pending:
        _count(summary, outcome)
    if len(pending) == 1:
        _log_outcome(*pending[0])
        return
    confirmed = [work.source_lead_id for work, outcome in pending
                 if outcome is LeadState.CONFIRMED]
    if confirmed:
        log.info("%d confirmed", len(confirmed), extra={
            "action": "batch.confirmed", "count": len(confirmed), "keys": confirmed,
            "from_state": "in_flight", "to_state": "confirmed"})
    for work, outcome in pending:
        if outcome is not LeadState.CONFIRMED:
            _log_outcome(work, outcome)


def _log_outcome(work: LeadWork, outcome: LeadState) -> None:
    level = logging.INFO if outcome is LeadState.CONFIRMED else logging.WARNING
    log.log(level, "%s", outcome.value, extra={
        "action": f"lead.{outcome.value}", "key": work.source_lead_id,
        "from_state": "in_flight", "to_state": outcome.value})


@asynccontextmanager
async def holding_lock(
    store: DeliveryStore, port: CRMRecordPort | None, clock: Clock
) -> AsyncIterator[int]:
    """Hold the worker lock (L7) for a run of cycles.  On acquiring it the target is
    checked (with a ``port``; ``runner.tasks.target``: a bad target stops the run before
    any record changes), then every in-flight record becomes uncertain: recovery runs
    once per acquisition, since no other worker can leave a record in flight while the
    lock is held.  Yields how many were recovered.  Raises LockHeld (exit 75) at once if
    another live worker holds it."""
    async with store.worker_lock():
        if port is not None:
            await target.check_for_writes(store, port, clock)
        yield await recover(store, clock)


async def run_cycle(
    store: DeliveryStore,
    port: CRMRecordPort,
    clock: Clock,
    *,
    guard: SendGuard | None = None,
    dispatch_limit: int | None = None,
    summary: CycleSummary | None = None,
    batch_size: int = 1,
) -> CycleSummary:
    """reconcile every uncertain record -> dispatch (L8), ``batch_size`` records per target
    request.  The caller holds the worker lock (``holding_lock``, which recovered
    in-flight records when it took it).  ``summary`` is filled as the cycle goes, so a
    cycle interrupted by a stop still reports what it did, and how many records were
    left uncertain."""
    guard = guard or NoGuard()
    summary = summary if summary is not None else CycleSummary()
    try:
        summary.reconciled += await reconcile_all(store, port, clock, guard)
        await dispatch_all(store, port, clock, summary, guard=guard, limit=dispatch_limit,
                           batch_size=batch_size)
    except anyio.get_cancelled_exc_class():
        # stopped: still counted, within a short shielded window; a store that cannot
        # answer then leaves it unknown (the stop is what is reported)
        with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_WINDOW), \
                contextlib.suppress(StoreError):
            summary.still_uncertain = await store.uncertain_count()
        raise
    # shielded: a stop that arrives now (a hard stop that ended the dispatch) still lets
    # the summary say how many are uncertain
    with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_WINDOW):
        summary.still_uncertain = await store.uncertain_count()
    return summary
