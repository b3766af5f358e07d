"""SQLite's delivery hook: a dispatch run's steps commit on a blocking connection of their
own (``connection.open_blocking``), from the run's worker thread, without a hop to the
event loop (the hop, not SQLite, is what costs).  The step is the engine's
(``runner.io.engine.delivery``), its statement the named ``finish_and_mark``; a batch's
step is one transaction of two statements, the outcomes (``_finish_batch``, no rows
back) then the next batch's mark (``finish_and_mark_batch`` with no outcomes, its rows
back): the same changes as the one statement, with half the rows to hand back to
Python, where the commit's thread waits for the interpreter the threads beside it hold.
A record of the outcomes no longer in flight refuses the whole step (nothing of it is
kept)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import anyio

from runner.ids import WriteId, seq_of
from runner.io.engine.delivery import (
    Done,
    Outcomes,
    batch_params,
    batch_result,
    step_params,
    step_result,
)
from runner.io.sqlite import connection
from runner.io.sqlite.base import QUERIES, SQLiteBase, bindable
from runner.leads.states import IllegalTransition

_STEP = QUERIES["finish_and_mark"].sql
_FINISH_BATCH = QUERIES["_finish_batch"].sql
_BATCH_STEP = QUERIES["finish_and_mark_batch"].sql
_NEXT_SEQ = QUERIES["next_batch_seq"].sql


class BlockingDispatchSteps:
    """``runner.store.DispatchSteps`` on a connection of their own: the same statement
    as ``finish_and_mark``; SQLite's write lock, with its busy timeout, orders it against
    the main connection's writers."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn, self._path = conn, path
        self._busy = threading.Lock()

    def finish_and_mark(self, done: Done, next_write_id: WriteId, now: datetime,
                        retry_at: datetime | None = None,
                        reason: str | None = None,
                        failure: str | None = None) -> int | None:
        rows = self._run(_STEP, step_params(done, next_write_id, now, retry_at, reason, failure))
        return step_result(rows, done, next_write_id)

    def finish_and_mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> dict[WriteId, int]:
        return self._batch_step(done, next_ids, batch_params(
            done, next_ids, now, retry_at, reason, failure), seq=False)[0]

    def mark_batch(
        self, done: Outcomes, next_ids: Sequence[WriteId], now: datetime,
        retry_at: datetime | None = None, reason: str | None = None,
        failure: str | None = None,
    ) -> tuple[dict[WriteId, int], int]:
        """As :meth:`finish_and_mark_batch`, and the seq the batch carries to a target
        that keeps marks, in one transaction (``runner.io.engine.marks``)."""
        return self._batch_step(done, next_ids, batch_params(
            done, next_ids, now, retry_at, reason, failure), seq=True)

    def _batch_step(self, done: Outcomes, next_ids: Sequence[WriteId],
                    params: dict[str, Any], *, seq: bool) -> tuple[dict[WriteId, int], int]:
        """One transaction: ``done``'s outcomes (every one in flight, else
        IllegalTransition and nothing kept), then ``next_ids``' mark, then (``seq``) the
        marked batch's seq."""
        with self._busy:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if done:
                        self._conn.execute(_FINISH_BATCH, bindable(params))
                        finished = self._conn.execute("SELECT changes()").fetchone()[0]
                        if finished != len(done):
                            raise IllegalTransition(
                                f"{len(done) - finished} record(s) were not in flight")
                    rows = (self._conn.execute(
                        _BATCH_STEP, bindable({**params, "done": [], "outcomes": []})
                    ).fetchall() if next_ids else [])
                    marked = batch_result(rows, [], next_ids)
                    mark = (self._conn.execute(_NEXT_SEQ).fetchone()
                            if seq and marked else None)
                    self._conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise connection.translate(exc, "writing the store", self._path) from None
        return marked, 0 if mark is None else seq_of(int(mark[0]), int(mark[1]))

    def take_landed(self) -> Outcomes:
        return ()  # each step is one transaction: a failed one committed nothing

    def _run(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        with self._busy:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise connection.translate(exc, "writing the store", self._path) from None

    def close(self) -> None:
        """Close unless a step is running (a thread abandoned in its commit still holds
        the connection; it is then left to be closed when it is collected)."""
        if not self._busy.acquire(blocking=False):
            return
        try:
            self._conn.close()
        finally:
            self._busy.release()


class BlockingDispatch(SQLiteBase):
    """Overrides ``DeliveryOps.dispatch_steps``."""

    @asynccontextmanager
    async def dispatch_steps(self) -> AsyncIterator[BlockingDispatchSteps]:
        conn = await anyio.to_thread.run_sync(connection.open_blocking, self.path)
        steps = BlockingDispatchSteps(conn, self.path)
        try:
            yield steps
        finally:
            steps.close()
