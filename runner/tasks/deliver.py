"""The write/reconcile cycle (SPEC L5-L8, E1, E2): recover, reconcile every uncertain
record, then dispatch prepared records and failed-safe ones whose backoff is over, in
accept order, every target request paced by the target's quota.

The recovery policy of this work is *mark uncertain and reconcile only* (K5): an external
write whose outcome is unknown is never retried.  This module and
``runner/tasks/pagerun.py`` (the sends of a run, in a worker thread) are built around
three rules:

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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from runner import crashpoints
from runner.clock import Clock
from runner.errors import StoreBusy, StoreError, TargetUnavailable
from runner.leads.pacing import Backoff
from runner.leads.port import CRMRecordPort
from runner.leads.states import IllegalTransition
from runner.storedata import LeadWork
from runner.tasks import rewind
from runner.tasks.outcomes import (
    CycleSummary,
    Pending,
    counted,
    done_of,
    retry_of,
)
from runner.tasks.pagerun import (
    BatchRun,
    NoGuard,
    PageRun,
    PipelinedBatchRun,
    SendGuard,
    Works,
)
from runner.tasks.reconcile import reconcile_all

if TYPE_CHECKING:
    from runner.store import DeliveryStore

log = logging.getLogger("runner.deliver")

PAGE = 200
#: records per page of a batched dispatch run: each page costs a read of the store (on
#: the loop, while the page before is sent) and a hand-over to the run's thread; one run
#: spans every page, so a batch may cross a page's end and the pipeline never drains there
BATCH_PAGE = 4000
#: how long a cancelled send may take to record its outcome before giving up (the
#: record then stays in_flight and the next start makes it uncertain)
RECORD_WINDOW = 2.0


async def dispatch_all(
    store: DeliveryStore,
    port: CRMRecordPort,
    clock: Clock,
    summary: CycleSummary,
    *,
    guard: SendGuard,
    limit: int | None = None,
    batch_size: int = 1,
    backoff: Backoff | None = None,
    pipeline: bool | None = None,
) -> None:
    """Send prepared records, and failed-safe ones whose backoff is over, in accept order,
    each at most once here.

    Two commits per record instead of three: a send's outcome is committed in the same
    statement as the next record's in-flight mark.  Every guarantee holds: the in-flight
    mark still commits before its send, and an outcome not yet committed when the process
    dies leaves its record in flight, which the next start makes uncertain and reconciles
    (a confirmed one is read back and confirmed again, never resent).

    With ``batch_size`` above 1 and a port that batches (``CRMRecordPort.batches``), the
    same holds for a batch of records at a time (:class:`BatchRun`): one commit marks the
    whole batch in flight, one request sends it, one readback reads every row of it, and
    one commit records every outcome together with the next batch's mark.

    Pacing (issue 16): each request waits for a token of the port's :class:`Pacer`
    *before* its records are marked in flight (so a wait never holds a record in flight,
    and a stop during it sends nothing); outcomes still pending are committed first when
    there is a wait.  A failed-safe outcome is due again at a time ``backoff`` draws (the
    target's ``retry_after`` when it said one), stored with the record.

    Pipelined (``pipeline``; None: when the target deduplicates by write_id): a batched run
    commits each batch's mark, with the outcomes of the request before, while the batch
    before is at the target (:class:`PipelinedBatchRun`, ``PIPELINE=1`` in the delivery
    model): two batches may be in flight at once, so a crash may leave both uncertain,
    which on a deduplicating target runner settles itself (SPEC E7).

    The whole dispatch runs in one worker thread (:class:`PageRun`): commit, send,
    commit, send, with no hop to the event loop in between, which would cost more than
    the commit; the loop reads each next page meanwhile and hands it over (:class:`_Pages`),
    so a batch may take the end of one page and the start of the next.  The run is in the
    guard's shield: a graceful stop lets the send in
    flight finish and starts no other; a hard stop abandons the thread (which then sends
    nothing more) and the records in flight are recorded uncertain.  The last outcomes are
    committed on the way out, also after a stop (then within a short shielded window).
    """
    backoff = backoff or Backoff()
    batch = batch_size if port.batches else 1
    pipelined = port.dedupes if pipeline is None else pipeline
    if port.marks and port.store_id is None:
        port.store_id = (await store.store_mark()).store_id
    size = PAGE if batch == 1 else max(BATCH_PAGE, batch)
    after = 0
    page = (await store.dispatchable_page(after, size, clock.now())
            if not guard.stopping else [])
    if not page:
        return
    pending: list[Pending] = []  # outcomes not yet committed
    pages = _Pages(store, clock, page[-1].seq, size)
    works = Works(page, pages.take)
    try:
        async with store.dispatch_steps() as steps:
            run: PageRun = (
                PageRun(steps, port, clock, summary, guard, limit, works, pending, backoff)
                if batch == 1 and not port.marks else
                BatchRun(steps, port, clock, summary, guard, limit, works, pending,
                         backoff, batch)
                if batch == 1 or not pipelined else
                PipelinedBatchRun(steps, port, clock, summary, guard, limit, works,
                                  pending, backoff, batch))
            try:
                with guard.shield():
                    await _beside(run.run, pages)
            finally:
                pending = run.take_over()
            pages.check()
    finally:
        if pending:
            # recorded whatever happened; after a cancellation only within a short window
            with anyio.CancelScope(shield=True), anyio.move_on_after(RECORD_WINDOW):
                await _record_last(store, port, clock, summary, pending)


class _Pages:
    """The pages after the first, each read on the loop while the one before it is sent
    (a read and the parse of its events take about a tenth of a batched page's time), and
    handed to the run's thread when it reaches them (:meth:`take`).  Reading ahead is
    safe: every mark is guarded by the state a record must be in, so a record that stopped
    being dispatchable since the read is skipped by the step that would mark it, and a
    failed-safe record that fell due since is sent by the next cycle.  A failed read ends
    the records the run takes (it finishes what it has in flight) and is raised once the
    run is over (:meth:`check`)."""

    def __init__(self, store: DeliveryStore, clock: Clock, after: int, size: int) -> None:
        self._store, self._clock, self._after, self._size = store, clock, after, size
        self._token = anyio.lowlevel.current_token()
        self._read: list[LeadWork] = []
        self._failure: Exception | None = None
        self._ready = threading.Event()  # a page is read (or there are no more)
        self._taken = anyio.Event()  # the run took it: read the next
        self._closed = False  # the run is over: read no more

    async def feed(self) -> None:
        """On the loop, beside the run: read a page, wait until the run takes it, read
        the next; an empty page, a failed read or :meth:`close` ends it."""
        try:
            while not self._closed:
                try:
                    page = await self._store.dispatchable_page(self._after, self._size,
                                                               self._clock.now())
                except Exception as exc:  # noqa: BLE001 - raised by check()
                    self._failure = exc
                    return
                if not page:
                    return
                self._after, self._read = page[-1].seq, page
                self._ready.set()
                await self._taken.wait()
                self._taken = anyio.Event()
        finally:  # no more pages: the run's take finds none
            self._ready.set()

    def close(self) -> None:
        """On the loop, once the run is over: the read under way is the last."""
        self._closed = True
        self._taken.set()

    def _took(self) -> None:
        self._taken.set()

    def check(self) -> None:
        """Raise a read's failure, once the run is over."""
        if self._failure is not None:
            raise self._failure

    def take(self) -> list[LeadWork]:
        """In the run's thread: the next page once it is read (empty: there are no
        more, or its read failed)."""
        self._ready.wait()
        page, self._read = self._read, []
        if not page:  # over: no more pages
            return []
        self._ready.clear()
        try:
            anyio.from_thread.run_sync(self._took, token=self._token)
        except RuntimeError:  # the loop is gone: an abandoned run sends nothing more
            return []
        return page


async def _beside(work: Callable[[], None], pages: _Pages) -> None:
    """Run ``work`` in a worker thread (abandoned on cancellation) while ``pages`` are read
    on the loop.  An error of ``work`` is raised as it is, not in a group: the reads are
    cancelled first."""
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(pages.feed)
        try:
            await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except Exception as exc:  # noqa: BLE001 - raised below, outside the group
            failure = exc
            group.cancel_scope.cancel()
        pages.close()
    if failure is not None:
        raise failure


async def _record_last(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, summary: CycleSummary,
    pending: list[Pending],
) -> None:
    """Commit the outcomes of the last sends of a dispatch run: a statement per kind of
    failure (each statement keeps one reason and retry time), which after a pipelined run
    (two batches in flight) may be several."""
    for group in _by_failure(pending):
        await _record(store, port, clock, summary, group)


def _by_failure(pending: list[Pending]) -> list[list[Pending]]:
    """``pending`` in groups that share their failure (confirmations join the first)."""
    groups: dict[object, list[Pending]] = {}
    for item in pending:
        key = item[2] if item[2] is not None else next(iter(groups), None)
        groups.setdefault(key, []).append(item)
    return list(groups.values())


async def _record(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, summary: CycleSummary,
    pending: list[Pending],
) -> None:
    crashpoints.hit("dispatch.before-confirm")
    try:
        if len(pending) == 1:
            await store.finish_send(pending[0][0].write_id, pending[0][1], clock.now(),
                                    *retry_of(pending))
        else:
            await store.finish_and_mark_batch(done_of(pending), [], clock.now(),
                                              *retry_of(pending))
    except IllegalTransition:
        # not all in flight any more: the step that was to record them (with the next
        # batch's mark) committed them, then failed or was cancelled before it answered
        # (on PostgreSQL its outcomes' transaction committed beside a failed mark), and
        # the statement here recorded only those still in flight; the error on its way
        # out is the one to report, and the cycle counts what the store now holds
        counted(summary, await _landed(store, pending), port.repeats)
        return
    crashpoints.hit("dispatch.after-confirm")
    counted(summary, pending, port.repeats)


async def _landed(store: DeliveryStore, pending: list[Pending]) -> list[Pending]:
    """The outcomes of ``pending`` the store holds: each record already in the state its
    outcome names (only this run moves a record out of in flight while it holds the
    worker lock); none if the store cannot be read now (the step's own error is on its
    way out, and a later cycle reads the records as they are)."""
    try:
        states = await store.lead_states([work.write_id for work, _, _ in pending])
    except (StoreError, StoreBusy) as exc:
        log.debug("the outcomes' states were not read: %s", exc)
        return []
    return [item for item in pending if states.get(item[0].write_id) is item[1]]


@asynccontextmanager
async def holding_lock(
    store: DeliveryStore, port: CRMRecordPort | None, clock: Clock, *,
    check_target: bool = True,
) -> AsyncIterator[int]:
    """Hold the worker lock (L7) for a run of cycles, and take over on acquiring it
    (``runner.tasks.rewind.take_over``).  Yields how many were recovered.  Raises
    LockHeld (exit 75) at once if another live worker holds it."""
    async with store.worker_lock():
        yield await rewind.take_over(store, port, clock, check_target=check_target)


async def run_cycle(
    store: DeliveryStore,
    port: CRMRecordPort,
    clock: Clock,
    *,
    guard: SendGuard | None = None,
    dispatch_limit: int | None = None,
    summary: CycleSummary | None = None,
    batch_size: int = 1,
    backoff: Backoff | None = None,
    pipeline: bool | None = None,
) -> CycleSummary:
    """reconcile every uncertain record -> dispatch (L8), ``batch_size`` records per target
    request (a readback of ``batch_size`` records per request in the reconcile pass), every
    request paced by the port's pacer; failed-safe records wait out their ``backoff``.
    The caller holds the worker lock (``holding_lock``, which recovered
    in-flight records when it took it).  ``summary`` is filled as the cycle goes, so a
    cycle interrupted by a stop still reports what it did, and how many records were
    left uncertain."""
    guard = guard or NoGuard()
    summary = summary if summary is not None else CycleSummary()
    batch_size = port.batch_size(batch_size)  # no more than the adapter takes
    try:
        if port.marks and port.fence_pending:  # not raised at the start: try again first
            try:
                await rewind.check_marks(store, port, clock)
            except TargetUnavailable as exc:  # the target is down: next cycle, again
                port.fence_pending = True
                log.warning("%s", exc.message, extra={"action": "store.fence_failed",
                                                      "reason": exc.reason})
        await rewind.check_keys(store, port, clock)
        rewound = await rewind.read_rewound(store, port, clock, batch_size, backoff)
        summary.reconciled += rewound.confirmed + rewound.adopted
        summary.requeued += rewound.requeued
        reconciled = await reconcile_all(store, port, clock, guard, batch_size, backoff)
        summary.reconciled += reconciled.confirmed
        summary.requeued += reconciled.requeued
        if not (port.marks and port.fence_pending):  # no send before the fence stands
            await dispatch_all(store, port, clock, summary, guard=guard,
                               limit=dispatch_limit, batch_size=batch_size, backoff=backoff,
                               pipeline=pipeline)
        if summary.refused_mark is not None:
            await rewind.refused(store, port, clock, summary.refused_mark)
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
