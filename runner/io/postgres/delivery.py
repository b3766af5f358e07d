"""PostgreSQL's delivery hooks.

The fence: while this store holds the worker lock (``runner.io.postgres.lock``), the
statement that marks a record in flight also checks that the lock's session still holds
it (``_finish_and_mark_fenced``).  If that session has ended, nothing changes and the send
does not start (``LockLost``, exit 74); the caller then records the outcome alone
(``finish_send`` is not fenced).  Once the lock's session is known to be gone
(``FENCE_LOST``: its termination was heard, or a reconnect dropped it) a mark is refused
without asking the server, until the lock is held again.

A batch's step apart (issue 32): a dispatch run's step that records one request's
outcomes and marks the next batch in flight (``finish_and_mark_batch``, and
``mark_batch``, whose batch seq commits with the mark) runs as two transactions at once, the
outcomes on a session of the run's own and the mark (fenced) on the store's, so that the
server updates both batches' rows together instead of one after the other (the row
updates are most of a step's time; schema v20 gives every writer one lock order, so the
two wait for each other only at the kept counts, never in a deadlock).  Each commit still
carries one request's outcomes, and every mark commits before its request; a crash
between the two commits leaves the outcomes' records in flight, uncertain at the next
start and read back, as when the one commit of both was lost (``SPLIT=1`` in the delivery
model).  Either transaction failing fails the step, with the mark's error first, and the
run ends: outcomes that did commit stay, and the run counts them in the cycle's summary
(``take_landed``; the loop's record of the run's last outcomes skips them), and a mark
that did commit beside failed outcomes is recorded "not sent" (failed-safe, due at once),
since nothing of that batch went out."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import anyio

from runner.errors import LockLost, RunnerError
from runner.ids import WriteId
from runner.io.engine.base import Row
from runner.io.engine.delivery import LoopDispatchSteps, Outcomes, _Finishing
from runner.io.postgres import connection
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.lock import FENCE_LOST, Fence
from runner.leads.states import LeadState

log = logging.getLogger(__name__)


class FencedMark(PostgresBase):
    """Overrides ``DeliveryOps._marking`` and ``DeliveryOps._marking_batch``."""

    #: a batch's mark and its seq are one transaction (``DeliveryOps.mark_batch``); its
    #: statement's trigger takes ``lead_counts`` before the outbox counter, as an accept
    #: does (schema v20; before it, the transaction locked the counts first itself);
    #: aborted as a deadlock victim all the same (by another writer), it is run again, as
    #: a single statement is (``PostgresBase._fetch``)
    mark_attempts = 5

    async def _marking(self, params: dict[str, Any]) -> Sequence[Row]:
        if (fence := self._fence) is None:
            return await self.fetch("finish_and_mark", **params)
        return self._held(await self.fetch("_finish_and_mark_fenced", **params,
                                           **self._live(fence).params()))

    async def _marking_batch(self, params: dict[str, Any]) -> Sequence[Row]:
        if (fence := self._fence) is None:
            return await self.fetch("finish_and_mark_batch", **params)
        return self._held(await self.fetch("_finish_and_mark_batch_fenced", **params,
                                           **self._live(fence).params()))

    def _live(self, fence: Fence) -> Fence:
        """``fence``, unless the lock's session is known to be gone (then LockLost)."""
        if fence is FENCE_LOST:
            raise self._lost()
        return fence

    def _held(self, rows: Sequence[Row]) -> Sequence[Row]:
        """The rows a fenced statement changed; LockLost if the lock was no longer held
        (then it changed nothing)."""
        if not rows[0][0]:
            raise self._lost()
        return [row[1:] for row in rows if row[1] is not None]

    def _lost(self) -> LockLost:
        return LockLost(f"the worker lock's session at {self.location.where} has ended "
                        "(terminated, timed out, or its server restarted); not sending: "
                        "what is in flight is recovered once the lock is held again")


class ApartDispatchSteps(LoopDispatchSteps):
    """``LoopDispatchSteps`` whose batch steps run apart (the module docstring): the
    outcomes on ``outcomes`` (a session of the run's own), the mark on the store's; a
    step that takes a batch seq (``mark_batch``, for a target that keeps marks) takes it
    in the mark's transaction, so a batch's seq and its mark still commit together."""

    def __init__(self, store: _Finishing, outcomes: _Finishing) -> None:
        super().__init__(store)
        self._marks, self._outcomes = store, outcomes
        self._landed: Outcomes = ()  # outcomes committed by a step whose mark failed

    def finish_and_mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        if not done or not next_ids:
            return super().finish_and_mark_batch(done, next_ids, now, retry_at, reason,
                                                 failure)
        marked, _ = anyio.from_thread.run(self._apart, done, next_ids, now, retry_at,
                                          reason, failure, False, token=self._token)
        return marked

    def mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]:
        if not done or not next_ids:
            return super().mark_batch(done, next_ids, now, retry_at, reason, failure)
        result: tuple[dict[WriteId, int], int] = anyio.from_thread.run(
            self._apart, done, next_ids, now, retry_at, reason, failure, True,
            token=self._token)
        return result

    async def _apart(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None, reason: str | None, failure: str | None, seq: bool,
    ) -> tuple[dict[WriteId, int], int]:
        """Both transactions at once (with ``seq``, the mark's takes the batch's seq as
        ``mark_batch`` does); each runs to its end whatever the other does (a commit is
        never cancelled half-way), then the mark's error, else the outcomes'."""
        errors: dict[str, Exception] = {}
        marked: tuple[dict[WriteId, int], int] = ({}, 0)

        async def outcomes() -> None:
            try:
                await self._outcomes.finish_and_mark_batch(done, [], now, retry_at, reason,
                                                           failure)
            except Exception as exc:  # noqa: BLE001 - raised below, after the mark
                errors["outcomes"] = exc

        async def mark() -> None:
            nonlocal marked
            try:
                if seq:
                    marked = await self._marks.mark_batch([], next_ids, now)
                else:
                    marked = (await self._marks.finish_and_mark_batch([], next_ids, now), 0)
            except Exception as exc:  # noqa: BLE001 - raised below
                errors["mark"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(outcomes)
            tg.start_soon(mark)
        if "outcomes" in errors and "mark" not in errors and marked[0]:
            await self._not_sent(list(marked[0]), now)
        if "mark" in errors and "outcomes" not in errors:
            self._landed = done  # the run counts them: they are recorded
        if errors:
            raise errors.get("mark") or errors["outcomes"]
        return marked

    def take_landed(self) -> Outcomes:
        landed, self._landed = self._landed, ()
        return landed

    async def _not_sent(self, write_ids: list[WriteId], now: datetime) -> None:
        """The step failed with its mark committed: nothing of the batch was sent, so it
        is recorded failed-safe, "not sent", due at once, as if it had never been marked
        (as a pipelined run records a batch marked and never sent).  If that fails too,
        the batch stays in flight: uncertain at the next start, read back, as after a
        crash between the mark and the request."""
        with contextlib.suppress(Exception):
            await self._marks.finish_and_mark_batch(
                [(w, LeadState.FAILED_SAFE) for w in write_ids], [], now, None,
                "marked in flight, not sent: the outcomes committed beside the mark failed",
                "not_sent")


class ApartSteps(PostgresBase):
    """Overrides ``DeliveryOps.dispatch_steps``: a dispatch run's steps apart, on a session
    of the run's own for the outcomes (opened with the run, closed after it); without that
    session (it could not be opened) the run's steps are one transaction each, as before."""

    @asynccontextmanager
    async def dispatch_steps(self) -> AsyncIterator[LoopDispatchSteps]:
        try:
            conn = await connection.connect(self.location)
        except (RunnerError, *connection.TRANSLATED) as exc:
            log.debug("a dispatch run's steps go as one transaction each: %s", exc)
            yield LoopDispatchSteps(self)  # type: ignore[arg-type]
            return
        other = type(self)(conn, self.location, self.scope_data, self.schema_version)
        try:
            yield ApartDispatchSteps(self, other)  # type: ignore[arg-type]
        finally:
            with anyio.CancelScope(shield=True):
                await other.aclose()
