"""A dispatch run in one worker thread, across pages: the send side of
``runner.tasks.deliver.dispatch_all``.

:class:`PageRun` sends a record per request, :class:`BatchRun` a batch per request; both
commit each in-flight mark before the send it guards (together with the outcomes of the
send before), check the :class:`SendGuard` before each record, wait for the target's
quota before a mark, and hand whatever is not yet committed back to the event loop when
the loop takes over (the records are done, it failed, or a hard stop abandoned the
thread).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, NamedTuple, Protocol

import anyio

from runner import crashpoints
from runner.clock import Clock
from runner.ids import WriteId
from runner.leads.failures import FAILURES
from runner.leads.marks import BatchMark
from runner.leads.pacing import Backoff
from runner.leads.port import CRMRecordPort, SendResult, readback_in_words
from runner.leads.states import LeadState
from runner.storedata import LeadWork
from runner.tasks.outcomes import (
    STOPPED,
    CycleSummary,
    Failure,
    Pending,
    counted,
    done_of,
    retry_of,
)

if TYPE_CHECKING:
    from runner.store import DispatchSteps

log = logging.getLogger("runner.deliver")  # the dispatch's lines, wherever they are made

#: the failures of a batch whose mark the target refused (it applied nothing)
MARK_REFUSALS = ("stale_mark", "foreign_mark")


class Marked(NamedTuple):
    """A batch after its in-flight mark committed: the records it marked (the others are
    no longer dispatchable: someone else's state), each one's attempts, and the mark the
    request carries to a target that keeps marks."""

    sent: list[LeadWork]
    attempts: dict[WriteId, int]
    mark: BatchMark | None


def stopped(works: list[LeadWork]) -> list[Pending]:
    """Records marked in flight whose request has not said more: uncertain if the run
    ends here."""
    return [(work, LeadState.UNCERTAIN, STOPPED) for work in works]


class Works:
    """The records a run sends, in accept order, across pages: its first page, then each
    page ``more`` hands it (in the run's thread, waiting for the page's read; an empty
    page: there are no more).  A batch may take the end of one page and the start of the
    next: one run spans the whole dispatch, so the pipelined run never drains at a page's
    end."""

    def __init__(self, page: list[LeadWork],
                 more: Callable[[], list[LeadWork]] | None = None) -> None:
        self._page, self._at, self._more = page, 0, more

    def take(self, count: int) -> list[LeadWork]:
        """Up to ``count`` next records; fewer only when there are no more."""
        chunk = self._page[self._at : self._at + count]
        self._at += len(chunk)
        while len(chunk) < count and self._more is not None:
            self._page = self._more()
            if not self._page:
                self._more = None
                break
            self._at = count - len(chunk)
            chunk += self._page[: self._at]
        return chunk


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


class PageRun:
    """A dispatch run in one worker thread, across pages (:class:`Works`).

    For each record: wait for the request's token (:meth:`_paced`), commit the previous
    record's outcome together with this record's in-flight mark
    (``DispatchSteps.finish_and_mark``), then send.  Before each record the thread checks
    the guard (a graceful stop, the dispatch limit).  The event loop only waits; when the
    wait ends — the records are done, it failed, or a hard stop abandoned the thread —
    :meth:`take_over` stops the thread before its next step and hands the loop the
    outcome not yet committed.  An abandoned thread never starts another commit or send;
    one already under way finishes, and every transition is guarded by the state it
    expects, so a late one changes nothing the loop has recorded.
    """

    def __init__(self, steps: DispatchSteps, port: CRMRecordPort, clock: Clock,
                 summary: CycleSummary, guard: SendGuard, limit: int | None,
                 works: Works, pending: list[Pending], backoff: Backoff) -> None:
        self.steps, self.port, self.clock, self.summary = steps, port, clock, summary
        self.guard, self.limit, self.works, self.backoff = guard, limit, works, backoff
        self.ended = False  # stopped, at the limit, or a mark refused
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
        """How many more records may be sent (0: stop here, also once abandoned)."""
        if self._stop():
            return 0
        if self.limit is None:
            return sys.maxsize
        return max(self.limit - self.summary.dispatched, 0)

    def _committed(self, pending: list[Pending]) -> None:
        """The outcomes of ``pending`` are committed: count and log them."""
        if pending:
            crashpoints.hit("dispatch.after-confirm")
        counted(self.summary, pending, self.port.repeats)

    def _unlanded(self, pending: list[Pending]) -> list[Pending]:
        """After a failed step that was to record ``pending``: the outcomes it committed
        all the same (``DispatchSteps.take_landed``) are counted; the rest, for the loop
        to record."""
        landed = set(self.steps.take_landed())
        if not landed:
            return pending
        self._committed([item for item in pending if (item[0].write_id, item[1]) in landed])
        return [item for item in pending if (item[0].write_id, item[1]) not in landed]

    def _stop(self) -> bool:
        with self._lock:
            return self._abandoned or self.guard.stopping

    def _paced(self) -> list[Pending] | None:
        """Wait for the next request's token (the target's quota, a RateLimited hold).
        With a wait, the outcomes still pending are committed first (they do not wait on
        the quota).  Returns what is still pending; None if the run must end here (a stop
        during the wait, or abandoned): then nothing more is sent."""
        with self._lock:
            if self._abandoned:
                return None
            pending = self._pending
        pacer = self.port.pacer
        wait = pacer.reserve()
        if wait <= 0:
            return pending
        if pending:
            crashpoints.hit("dispatch.before-confirm")
            self.steps.finish_and_mark_batch(done_of(pending), [], self.clock.now(),
                                             *retry_of(pending))
            alive = self._go_on([])
            self._committed(pending)
            if not alive:
                return None
            pending = []
        if not pacer.pause(wait, self._stop):
            self.ended = True
            return None
        return pending

    def _outcome(self, result: SendResult, attempts: int) -> tuple[LeadState, Failure | None]:
        """A send's outcome (L5): only a typed "not sent" is failed-safe (due again after
        its backoff), only an exact readback is confirmed; everything else — another
        error, a failed or inexact readback — is uncertain.  Each failure says why."""
        if result.verdict == "match":
            return LeadState.CONFIRMED, None
        if result.verdict == "not_sent":
            return LeadState.FAILED_SAFE, Failure(
                result.failure or "not_sent", result.error or FAILURES["not_sent"],
                self.backoff.next_attempt(attempts, self.clock.now(), result.retry_after))
        if result.error is not None:
            return LeadState.UNCERTAIN, Failure(result.failure or "failed", result.error)
        return LeadState.UNCERTAIN, Failure(  # the write returned; the readback says no
            "readback", f"{FAILURES['readback']}: {readback_in_words(result.verdict)}")

    def run(self) -> None:
        summary = self.summary
        while True:
            if not self._room():
                self.ended = True
                return
            taken = self.works.take(1)
            if not taken:
                return
            work = taken[0]
            pending = self._paced()
            if pending is None:
                return
            done = (pending[0][0].write_id, pending[0][1]) if pending else None
            if done is not None:
                crashpoints.hit("dispatch.before-confirm")
            attempts = self.steps.finish_and_mark(done, work.write_id, self.clock.now(),
                                                  *retry_of(pending))
            # the previous outcome is in; this record is in flight (uncertain until its
            # send says more)
            self._go_on([(work, LeadState.UNCERTAIN, STOPPED)] if attempts is not None
                        else [])
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
            # blocking, in this thread: a hard stop abandons it (the loop records uncertain)
            outcome, failure = self._outcome(
                self.port.send_blocking(work.event, work.write_id), attempts)
            if not self._go_on([(work, outcome, failure)]):
                return  # abandoned while out: the loop has recorded it uncertain


class BatchRun(PageRun):
    """A batched dispatch run in one worker thread (issue 16): as :class:`PageRun`,
    a batch of up to ``batch`` records at a time.

    For each batch: wait for the request's token, commit the previous batch's outcomes
    together with this batch's in-flight mark (``DispatchSteps.finish_and_mark_batch``:
    on PostgreSQL fenced by the worker lock), then one request
    (``CRMRecordPort.send_batch_blocking``: the batch write and the exact readback of
    every row of it).  Each record's outcome is its own: a ``BeforeWriteError`` makes the
    whole batch failed-safe, any other failure or an incomplete answer leaves every record
    not proven by its readback uncertain.
    """

    def __init__(self, steps: DispatchSteps, port: CRMRecordPort, clock: Clock,
                 summary: CycleSummary, guard: SendGuard, limit: int | None,
                 works: Works, pending: list[Pending], backoff: Backoff,
                 batch: int) -> None:
        super().__init__(steps, port, clock, summary, guard, limit, works, pending, backoff)
        self.batch = batch

    def _next_chunk(self) -> list[LeadWork] | None:
        """The next batch to mark, as many as there is room for; None if there is no room
        (the run ends: a stop, the dispatch limit), empty if there are no more records."""
        room = self._room()
        if not room:
            self.ended = True
            return None
        return self.works.take(min(self.batch, room))

    def _commit(self, pending: list[Pending], chunk: list[LeadWork]) -> Marked:
        """One commit: the outcomes of ``pending`` (one request's) and the in-flight mark
        of ``chunk`` (with its seq, for a target that keeps marks)."""
        if pending:
            crashpoints.hit("dispatch.before-confirm")
        mark: BatchMark | None = None
        ids = [work.write_id for work in chunk]
        if self.port.marks and self.port.store_id is not None:
            marked, seq = self.steps.mark_batch(done_of(pending), ids, self.clock.now(),
                                                *retry_of(pending))
            mark = BatchMark(self.port.store_id, seq) if seq else None
        else:
            marked = self.steps.finish_and_mark_batch(done_of(pending), ids,
                                                      self.clock.now(), *retry_of(pending))
        return Marked([work for work in chunk if work.write_id in marked], marked, mark)

    def _send(self, batch: Marked) -> list[Pending] | None:
        """The request of a batch marked in flight, and its outcomes (not committed);
        None if the run was abandoned before it started."""
        sent = batch.sent
        crashpoints.hit("dispatch.after-in-flight")
        self.summary.dispatched += len(sent)
        with self._lock:  # the last moment a hard stop keeps this send from starting
            if self._abandoned:
                return None
        if len(sent) == 1:  # the line of a single send
            log.info("sending", extra={"action": "lead.in_flight",
                                       "key": sent[0].source_lead_id,
                                       "attempts": batch.attempts[sent[0].write_id]})
        else:  # one line for the batch: a line per record costs more than its commit
            log.info("sending a batch of %d", len(sent), extra={
                "action": "batch.in_flight", "count": len(sent),
                "keys": [work.source_lead_id for work in sent]})
        results = self.port.send_batch_blocking([(work.event, work.write_id)
                                                 for work in sent], batch.mark)
        attempts = max(batch.attempts[work.write_id] for work in sent)
        outcomes: list[Pending] = [
            (work, *self._outcome(result, attempts))
            for work, result in zip(sent, results, strict=True)]
        if results and results[0].failure in MARK_REFUSALS:
            # the target refused the batch's mark, applying nothing: the store is behind
            # it or not its owner; nothing more is sent until that is settled (E8)
            self.summary.refused_mark = results[0].failure
            self.ended = True
        return outcomes

    def run(self) -> None:
        while chunk := self._next_chunk():
            pending = self._paced()
            if pending is None:
                return
            try:
                batch = self._commit(pending, chunk)
            except Exception:
                self._go_on(self._unlanded(pending))
                raise
            # the previous outcomes are in; this batch is in flight (uncertain until the
            # request says more)
            self._go_on(stopped(batch.sent))
            self._committed(pending)
            if not batch.sent:
                continue  # none dispatchable any more: someone else's state
            outcomes = self._send(batch)
            if outcomes is None or not self._go_on(outcomes):
                return  # abandoned: the loop has recorded them uncertain
            if self.ended:
                return  # a mark refused


class _Beside:
    """A call run in a thread of its own beside this one (a daemon: a commit abandoned by
    a hard stop never holds the process at exit); :meth:`result` waits for it."""

    def __init__(self, call: Callable[[], Marked]) -> None:
        self._call = call
        self._value: Marked | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="runner-commit", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc

    def result(self) -> Marked:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


class PipelinedBatchRun(BatchRun):
    """:class:`BatchRun` with the store's commit beside the target's request (issue 32):
    while a batch is at the target, one commit (in a thread of its own) records the
    outcomes of the request before it and marks the next batch in flight, so two batches
    may be in flight at once: the one at the target and the next one, marked and not sent
    yet.  Every guarantee of the serial run holds, as the delivery model checks
    (``PIPELINE=1``, docs/model.md): each mark commits before its request, requests go
    out one at a time in mark order, each commit carries one request's outcomes, and an
    outcome not committed when the process dies leaves its record in flight (uncertain at
    the next start, read back).

    It pipelines only a target with no quota and no hold in force (``Pacer.unpaced``):
    otherwise a step waits for its token before its mark, serially, as in
    :class:`BatchRun`.  A run that ends (a graceful stop, the dispatch limit, a mark
    refused) with the next batch marked and not sent records that batch failed-safe, due
    at once: it was never sent.  A hard stop abandons the thread; what was in flight
    (both batches) is recorded uncertain, as in the serial run."""

    def _not_sent(self, works: list[LeadWork]) -> list[Pending]:
        failure = Failure("not_sent", "marked in flight, not sent: the run ended first",
                          self.clock.now())
        return [(work, LeadState.FAILED_SAFE, failure) for work in works]

    def _commit_alone(self, pending: list[Pending]) -> None:
        """The outcomes of one request, committed alone (no batch to mark beside them)."""
        if pending:
            self._commit(pending, [])
            self._committed(pending)

    def _end_unsent(self, prev: list[Pending], going: Marked) -> None:
        """The run ends with ``going`` marked and not sent: ``prev``'s outcomes commit,
        and ``going`` is left to the loop to record failed-safe (it was never sent)."""
        self._commit_alone(prev)
        self._go_on(self._not_sent(going.sent))
        self.ended = True

    def _next_room(self, going: Marked) -> int:
        """How many records the batch after ``going`` may take (0: none)."""
        room = self._room()
        if room and self.limit is not None:
            room = max(room - len(going.sent), 0)  # going's are not counted yet
        return room

    def run(self) -> None:
        prev: list[Pending] = []  # the outcomes of the request before: not committed yet
        going: Marked | None = None  # the batch marked in flight, to go out next
        paced = False  # whether going's request already has its token
        pacer = self.port.pacer
        while True:
            if going is None:  # a serial step: the first of the run, or after a skip
                if not (chunk := self._next_chunk()):
                    return
                pending = self._paced()  # the outcomes pending: prev's, or none
                if pending is None:
                    return
                going, paced, prev = self._commit(pending, chunk), True, []
                self._go_on(stopped(going.sent))
                self._committed(pending)
                if not going.sent:
                    going = None
                    continue
            elif not self._room():  # a stop (or the limit) before it went out
                self._end_unsent(prev, going)
                return
            if not paced and (wait := pacer.reserve()) > 0 and not pacer.pause(wait,
                                                                              self._stop):
                self._end_unsent(prev, going)  # held (RateLimited), and stopped meanwhile
                return
            # going goes out; beside its request, one commit records prev's outcomes and
            # marks the next batch (none when the quota paces requests: its step waits for
            # its token first, serially)
            room = self._next_room(going) if pacer.unpaced() else 0
            chunk = self.works.take(min(self.batch, room)) if room else []
            beside = (_Beside(functools.partial(self._commit, prev, chunk))
                      if prev or chunk else None)
            # if the run ends here: chunk was never sent (an abandoned run sends nothing
            # more), whether or not its mark landed
            self._go_on([*prev, *stopped(going.sent), *self._not_sent(chunk)])
            outcomes = self._send(going)
            following = None
            try:
                if beside is not None:
                    following = beside.result()
            except Exception:
                if outcomes is not None:  # the commit recorded none of prev, or some
                    self._go_on([*self._unlanded(prev), *outcomes])
                raise
            if outcomes is None:
                return  # abandoned: the loop has recorded them uncertain
            self._committed(prev)
            prev, paced = outcomes, False
            going = following if following is not None and following.sent else None
            if not self._go_on([*prev, *stopped(going.sent if going else [])]):
                return  # abandoned: the loop has recorded them uncertain
            if self.ended:  # a mark refused: nothing more is sent
                if going is not None:
                    self._end_unsent(prev, going)
                return
