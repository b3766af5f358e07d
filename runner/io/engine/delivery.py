"""Delivery (SPEC L4-L8): the target pin, recovery, the work pages and the send
transitions, written once.

Each operation is one statement, so one call and one transaction; the outbox events are
written by the schema's triggers in the same transaction.  Every transition names the
state it expects in its WHERE clause: a stale or repeated call updates nothing instead of
moving a record along the wrong edge, and the engine refuses what it did not change.

The send transitions are one statement, ``finish_and_mark``: the outcome of the send that
finished (``done``: in_flight -> outcome) and the in-flight mark of the next one
(prepared/failed_safe -> in_flight, ``attempts + 1``), either of them absent
(a first mark has no ``done``, ``finish_send`` no next record).  A dialect may
override two hooks: ``_marking`` runs the statement when it marks a record (PostgreSQL
checks its worker lock's fence there) and ``dispatch_steps`` gives a dispatch run's
thread its blocking steps (SQLite commits on a connection of its own; by default each step
hops back to the event loop, :class:`LoopDispatchSteps`).

Batched dispatch (issue 16) has the same step for many records: ``finish_and_mark_batch``
records the outcomes of the batch that finished and marks the next batch in flight, in one
statement; PostgreSQL fences it like the single mark (``_marking_batch``).

Backoff (issue 16, v12): a step's failed_safe outcomes carry ``retry_at``, the time they
are due again (``next_attempt_at``); ``dispatchable_page`` skips a record not due.  A
reconcile pass reads its keys once (``reconcile_order``), then its records a chunk at a
time (``uncertain_by_seqs``) and records a chunk's verdicts in one statement
(``record_reconcile_batch``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio.from_thread
import anyio.lowlevel

from runner.clock import to_text
from runner.ids import WriteId, seq_of
from runner.io.engine.base import Db, Row
from runner.leads.failures import FAILURES
from runner.leads.states import IllegalTransition, LeadState, check_transition
from runner.limits import MAX_LAST_ERROR

if TYPE_CHECKING:
    from runner.storedata import LeadWork, Requeue

#: one send step: the record that finished and its outcome, if any
Done = tuple[WriteId, LeadState] | None


def last_error(reason: str | None) -> str | None:
    """A failed_safe outcome's reason as stored (``last_error``, v13): printable, at most
    ``MAX_LAST_ERROR`` characters; None for none."""
    if reason is None:
        return None
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    if len(text) > MAX_LAST_ERROR:
        text = text[: MAX_LAST_ERROR - 1] + "…"
    return text or None


def step_params(done: Done, next_write_id: WriteId | None, now: datetime,
                retry_at: datetime | None = None,
                reason: str | None = None, failure: str | None = None) -> dict[str, Any]:
    """The ``finish_and_mark`` parameters of a step; refuses an outcome that is not a
    transition out of in_flight.  ``retry_at``: when a failed_safe outcome is due again
    (None: at once); ``reason``: why a failed_safe or uncertain outcome failed
    (``last_error``), ``failure`` its kind (``last_failure``)."""
    if done is not None:
        check_transition(LeadState.IN_FLIGHT, done[1])
    return {"now": to_text(now), "next": next_write_id,
            "done": None if done is None else done[0],
            "outcome": None if done is None else done[1].value,
            "retry_at": None if retry_at is None else to_text(retry_at),
            "reason": last_error(reason), "failure": failure}


def step_result(rows: Sequence[Row], done: Done, next_write_id: WriteId | None) -> int | None:
    """The next record's new attempts (None: it is no longer dispatchable) from the
    ``write_id, attempts`` rows the step changed; refuses a ``done`` not in flight."""
    changed = {str(r[0]): int(r[1]) for r in rows}
    if done is not None and done[0] not in changed:
        raise IllegalTransition(f"record {done[0]} was not in flight")
    return None if next_write_id is None else changed.get(next_write_id)


#: a batch step's finished records and their outcomes (possibly none)
Outcomes = Sequence[tuple[WriteId, LeadState]]


def batch_params(done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
                 retry_at: datetime | None = None,
                 reason: str | None = None, failure: str | None = None) -> dict[str, Any]:
    """The ``finish_and_mark_batch`` parameters; refuses an outcome that is not a
    transition out of in_flight.  ``retry_at``: when the failed_safe outcomes are due
    again (None: at once), ``reason`` why they (or the uncertain ones) failed and
    ``failure`` its kind; one of each for the step, as its outcomes are one request's."""
    for _, outcome in done:
        check_transition(LeadState.IN_FLIGHT, outcome)
    return {"now": to_text(now), "done": [str(w) for w, _ in done],
            "outcomes": [o.value for _, o in done], "next": [str(w) for w in next_ids],
            "retry_at": None if retry_at is None else to_text(retry_at),
            "reason": last_error(reason), "failure": failure}


def batch_result(
    rows: Sequence[Row], done: Outcomes, next_ids: Sequence[WriteId]
) -> dict[WriteId, int]:
    """The new attempts of the next batch's records that were marked (a record missing
    is no longer dispatchable); refuses a ``done`` record that was not in flight."""
    changed = {str(r[0]): int(r[1]) for r in rows}
    missing = [w for w, _ in done if w not in changed]
    if missing:
        raise IllegalTransition(f"{len(missing)} record(s) were not in flight "
                                f"(first: {missing[0]})")
    return {w: changed[w] for w in next_ids if w in changed}


class _Finishing(Protocol):
    async def finish_and_mark(
        self, done: Done, next_write_id: WriteId, now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> int | None: ...

    async def finish_and_mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]: ...

    async def mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]: ...


class LoopDispatchSteps:
    """Dispatch steps (``runner.store.DispatchSteps``) that run a store's own async
    ``finish_and_mark`` on the event loop, called from the dispatch run's worker thread:
    for a store whose driver is async (asyncpg), and for test wrappers that count or fail
    the store's operations.  Each step is one hop back to the loop, from any thread (the
    pipelined run commits from a thread of its own): made on the loop, they keep its
    token."""

    def __init__(self, store: _Finishing) -> None:
        self._store = store
        self._token = anyio.lowlevel.current_token()

    def finish_and_mark(self, done: Done, next_write_id: WriteId, now: datetime,
                        retry_at: datetime | None = None,
                        reason: str | None = None,
                        failure: str | None = None) -> int | None:
        return anyio.from_thread.run(self._store.finish_and_mark, done, next_write_id, now,
                                     retry_at, reason, failure, token=self._token)

    def finish_and_mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        return anyio.from_thread.run(self._store.finish_and_mark_batch, done, next_ids, now,
                                     retry_at, reason, failure, token=self._token)

    def mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]:
        return anyio.from_thread.run(self._store.mark_batch, done, next_ids, now,
                                     retry_at, reason, failure, token=self._token)

    def take_landed(self) -> Outcomes:
        return ()  # each step is one transaction: a failed one committed nothing


@asynccontextmanager
async def loop_dispatch_steps(store: _Finishing) -> AsyncIterator[LoopDispatchSteps]:
    """``Store.dispatch_steps`` for a store whose operations are all async."""
    yield LoopDispatchSteps(store)


def lead_work(row: Row) -> LeadWork:
    """A ``LeadWork`` from a row that starts ``seq, source_lead_id, write_id, state,
    canonical``."""
    return lead_works([row])[0]


#: a state by its stored name (a dict lookup; the enum's own lookup costs several times more)
_STATES = {state.value: state for state in LeadState}


def lead_works(rows: Sequence[Row]) -> list[LeadWork]:
    """:func:`lead_work` for each row, in one loop: dispatch parses a page of records
    beside the thread that sends the page before, and both need the interpreter."""
    if not rows:
        return []  # an empty page needs no model: a ``once`` with nothing to do loads none
    from runner.leads.models import LeadEvent  # the model is built only by commands that deliver
    from runner.storedata import LeadWork

    parse, states = LeadEvent.model_validate_json, _STATES
    return [LeadWork(int(r[0]), str(r[1]), WriteId(str(r[2])), states[r[3]], parse(r[4]))
            for r in rows]


class DeliveryOps(Db):
    #: how many times the transaction of :meth:`mark_batch` runs when the store aborts it
    #: as a deadlock victim (``StoreBusy``): once here; the PostgreSQL store runs it again
    #: (``runner.io.postgres.delivery``), as it runs a single statement again
    mark_attempts = 1

    async def pinned_target(self) -> str | None:
        rows = await self.fetch("pinned_target")
        return str(rows[0][0]) if rows else None

    async def pin_target(self, target_id: str, now: datetime) -> str:
        # a pin never changes once written (the schema refuses it), so the insert and the
        # read need no common transaction: whatever the read sees is final
        await self.fetch("pin_target", target_id=target_id, now=to_text(now))
        return str((await self.fetch("pinned_target"))[0][0])

    async def recover_in_flight(self, now: datetime) -> list[str]:
        """Every in-flight record becomes uncertain, its ``last_error`` saying why (the
        kind ``recovered``)."""
        return [str(r[0]) for r in await self.fetch(
            "recover_in_flight", now=to_text(now), reason=FAILURES["recovered"])]

    async def uncertain_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        rows = await self.fetch("uncertain_page", after_seq=after_seq, limit=limit)
        return lead_works(rows)

    async def reconcile_order(self) -> list[int]:
        """The seqs of the uncertain records in reconcile order (oldest reconcile attempt
        first, then accept order): a pass's keys, read once before it starts, so a record
        it reads back (which moves to the end of the order) is not read again."""
        return [int(r[0]) for r in await self.fetch("reconcile_order")]

    async def uncertain_by_seqs(self, seqs: Sequence[int]) -> list[LeadWork]:
        """The records among ``seqs`` still uncertain, in the order of ``seqs``."""
        rows = await self.fetch("uncertain_by_seqs", seqs=list(seqs))
        found = {int(r[0]): r for r in rows}
        return lead_works([found[seq] for seq in seqs if seq in found])

    async def lead_states(self, write_ids: Sequence[WriteId]) -> dict[WriteId, LeadState]:
        rows = await self.fetch("lead_states", write_ids=[str(w) for w in write_ids])
        return {WriteId(str(r[0])): _STATES[r[1]] for r in rows}

    async def dispatchable_page(
        self, after_seq: int, limit: int, now: datetime | None = None
    ) -> list[LeadWork]:
        """Prepared records and failed_safe ones due at ``now`` (None: the records'
        backoff is not looked at, every failed_safe record is due)."""
        due = to_text(now) if now is not None else "9999"
        rows = await self.fetch("dispatchable_page", after_seq=after_seq, limit=limit,
                                now=due)
        return lead_works(rows)

    async def finish_send(self, write_id: WriteId, outcome: LeadState, now: datetime,
                          retry_at: datetime | None = None,
                          reason: str | None = None,
                          failure: str | None = None) -> None:
        # marks nothing, so it is not fenced: an outcome is recorded also after the worker
        # lock's session has ended
        done = (write_id, outcome)
        rows = await self.fetch("finish_and_mark", **step_params(done, None, now, retry_at,
                                                              reason, failure))
        step_result(rows, done, None)

    async def finish_and_mark(
        self, done: Done, next_write_id: WriteId, now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> int | None:
        rows = await self._marking(step_params(done, next_write_id, now, retry_at, reason, failure))
        return step_result(rows, done, next_write_id)

    async def _marking(self, params: dict[str, Any]) -> Sequence[Row]:
        """Hook: run ``finish_and_mark`` for a step that marks a record in flight."""
        return await self.fetch("finish_and_mark", **params)

    async def finish_and_mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        params = batch_params(done, next_ids, now, retry_at, reason, failure)
        if next_ids:
            rows = await self._marking_batch(params)
        else:  # marks nothing, so not fenced (as finish_send)
            rows = await self.fetch("finish_and_mark_batch", **params)
        return batch_result(rows, done, next_ids)

    async def mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]:
        """``finish_and_mark_batch`` (fenced on PostgreSQL) and the seq the batch carries,
        in one transaction; no seq (0) when no record was marked.  A transaction aborted
        as a deadlock victim was rolled back whole (nothing marked, so nothing is sent):
        it is run again, up to ``mark_attempts`` times in all."""
        from runner.errors import StoreBusy

        params = batch_params(done, next_ids, now, retry_at, reason, failure)
        for attempt in range(1, self.mark_attempts + 1):
            try:
                async with self.transaction():
                    rows = await self._marking_batch(params)
                    marked: dict[WriteId, int] = batch_result(rows, done, next_ids)
                    if not marked:
                        return marked, 0
                    seq = (await self.fetch("next_batch_seq"))[0]
            except StoreBusy:
                if attempt == self.mark_attempts:
                    raise
                await anyio.sleep(0.01 * attempt)
                continue
            return marked, seq_of(int(seq[0]), int(seq[1]))
        raise AssertionError("unreachable")

    async def _marking_batch(self, params: dict[str, Any]) -> Sequence[Row]:
        """Hook: run ``finish_and_mark_batch`` for a step that marks records in flight."""
        return await self.fetch("finish_and_mark_batch", **params)

    async def uncertain_count(self) -> int:
        """How many records are uncertain now (the cycle summary's ``still_uncertain``)."""
        return int((await self.fetch("uncertain_count"))[0][0])

    def dispatch_steps(self) -> AbstractAsyncContextManager[Any]:
        """Hook: a dispatch run's blocking steps (here: each one hops to the loop; a
        network round trip costs more than the hop)."""
        return loop_dispatch_steps(self)

    async def record_reconcile(
        self, write_id: WriteId, *, confirmed: bool, note: str | None, now: datetime,
        outcome: str | None = None,
    ) -> None:
        rows = await self.fetch("record_reconcile", write_id=write_id, ok=confirmed,
                                note=note, outcome=outcome, now=to_text(now))
        if not rows:
            raise IllegalTransition(f"record {write_id} was not uncertain")

    async def record_reconcile_batch(
        self, verdicts: Sequence[tuple[WriteId, str | None, str | None]], now: datetime,
        requeue: Requeue | None = None,
    ) -> set[WriteId]:
        """``record_reconcile`` for a chunk read back in one request, in one statement:
        per record ``(write_id, outcome, note)``, ``outcome`` None when its readback
        matched (confirmed).  With ``requeue`` (SPEC E7), its records are authorised for a
        resend and queued again in the same transaction (``authorize_resends``, then
        ``requeue_authorized``).  Returns the write_ids that were still uncertain
        (changed)."""
        if requeue is None or not requeue.write_ids:
            return await self._record_verdicts(verdicts, now)
        at = to_text(now)
        async with self.transaction():
            changed = await self._record_verdicts(verdicts, now) if verdicts else set()
            rows = await self.fetch("authorize_resends", write_ids=[
                str(w) for w in requeue.write_ids], target_id=requeue.target_id, now=at,
                evidence=requeue.evidence)
            if rows:
                ids = [str(r[0]) for r in rows]
                due = requeue.due(max(int(r[1]) for r in rows))
                moved = await self.fetch("requeue_authorized", write_ids=ids, now=at,
                                         retry_at=to_text(due),
                                         reason=last_error(requeue.reason))
                if len(moved) != len(ids):  # rolls the authorisations back too
                    raise IllegalTransition(f"{len(ids) - len(moved)} record(s) authorised "
                                            "for a resend were no longer uncertain")
                changed.update(WriteId(w) for w in ids)
        return changed

    async def _record_verdicts(
        self, verdicts: Sequence[tuple[WriteId, str | None, str | None]], now: datetime
    ) -> set[WriteId]:
        if not verdicts:
            return set()
        rows = await self.fetch(
            "record_reconcile_batch", write_ids=[str(w) for w, _, _ in verdicts],
            outcomes=[o for _, o, _ in verdicts], notes=[n for _, _, n in verdicts],
            now=to_text(now))
        return {WriteId(str(r[0])) for r in rows}
