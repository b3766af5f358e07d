"""Delivery queries for SQLite (SPEC L4-L8).

Each operation is one statement, so one awaited call and one transaction; the outbox
events are written by the schema's triggers in the same transaction.  Every transition
names the state it expects in its WHERE clause: a stale or repeated call updates nothing
instead of moving a record along the wrong edge.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.sqlite import connection
from runner.io.sqlite.base import SQLiteBase
from runner.states import IllegalTransition, LeadState, check_transition

if TYPE_CHECKING:
    from runner.storework import LeadWork

_WORK_COLUMNS = "seq, source_lead_id, write_id, state, canonical"
_MARK = (
    "UPDATE leads SET state = 'in_flight', attempts = attempts + 1, updated_at = :now "
    "WHERE write_id = :next AND state IN ('prepared', 'failed_safe') "
    "RETURNING write_id, attempts"
)
# one statement, so one commit, for both rows; each row is guarded by the state it must
# be in, and the triggers write both state_changed events
_FINISH_AND_MARK = (
    "UPDATE leads SET "
    "state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END, "
    "attempts = attempts + (write_id = :next), updated_at = :now "
    "WHERE (write_id = :done AND state = 'in_flight') "
    "OR (write_id = :next AND state IN ('prepared', 'failed_safe')) "
    "RETURNING write_id, attempts"
)


def _finish_and_mark_args(
    done: tuple[WriteId, LeadState] | None, next_write_id: WriteId, now: datetime
) -> tuple[str, dict[str, str]]:
    if done is None:
        return _MARK, {"next": next_write_id, "now": to_text(now)}
    check_transition(LeadState.IN_FLIGHT, done[1])
    return _FINISH_AND_MARK, {"next": next_write_id, "done": done[0],
                              "outcome": done[1].value, "now": to_text(now)}


def _marked(
    rows: Sequence[Sequence[Any]], done: tuple[WriteId, LeadState] | None, next_write_id: str
) -> int | None:
    changed = {str(r[0]): int(r[1]) for r in rows}
    if done is not None and done[0] not in changed:
        raise IllegalTransition(f"record {done[0]} was not in flight")
    return changed.get(next_write_id)


class BlockingDispatchSteps:
    """``runner.store.DispatchSteps`` on a connection of their own (see
    ``connection.open_blocking``): the dispatch thread commits without a hop.  The same
    statements as ``finish_and_mark``; SQLite's write lock, with its busy timeout,
    orders them against the main connection's writers."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn, self._path = conn, path
        self._busy = threading.Lock()

    def finish_and_mark(
        self, done: tuple[WriteId, LeadState] | None, next_write_id: WriteId, now: datetime
    ) -> int | None:
        sql, params = _finish_and_mark_args(done, next_write_id, now)
        with self._busy:
            try:
                rows = self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise connection.translate(exc, "writing the store", self._path) from None
        return _marked(rows, done, next_write_id)

    def close(self) -> None:
        """Close unless a step is running (a thread abandoned in its commit still holds
        the connection; it is then left to be closed when it is collected)."""
        if not self._busy.acquire(blocking=False):
            return
        try:
            self._conn.close()
        finally:
            self._busy.release()


def _work(row: Sequence[Any]) -> LeadWork:
    from runner.models import LeadEvent  # the model is built only by commands that deliver
    from runner.storework import LeadWork

    return LeadWork(
        seq=int(row[0]),
        source_lead_id=str(row[1]),
        write_id=WriteId(str(row[2])),
        state=LeadState(row[3]),
        event=LeadEvent.model_validate_json(row[4]),
    )


class DeliveryQueries(SQLiteBase):
    async def pinned_target(self) -> str | None:
        async with self._guard():
            rows = await self._fetchall("SELECT target_id FROM target_pin")
        return str(rows[0][0]) if rows else None

    async def pin_target(self, target_id: str, now: datetime) -> str:
        # a pin never changes once written (the schema refuses it), so the insert and the
        # read need no common transaction: whatever the read sees is final
        async with self._guard():
            await self._fetchall(
                "INSERT INTO target_pin (only_row, target_id, pinned_at) VALUES (1, ?, ?) "
                "ON CONFLICT (only_row) DO NOTHING", (target_id, to_text(now)))
            rows = await self._fetchall("SELECT target_id FROM target_pin")
        return str(rows[0][0])

    async def recover_in_flight(self, now: datetime) -> list[str]:
        async with self._guard():
            rows = await self._fetchall(
                "UPDATE leads SET state = 'uncertain', updated_at = ? "
                "WHERE state = 'in_flight' RETURNING source_lead_id",
                (to_text(now),),
            )
        return [str(r[0]) for r in rows]

    async def _page(self, states: str, after_seq: int, limit: int) -> list[LeadWork]:
        async with self._guard():
            rows = await self._fetchall(
                f"SELECT {_WORK_COLUMNS} FROM leads WHERE state IN ({states}) AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (after_seq, limit),
            )
        return [_work(r) for r in rows]

    async def uncertain_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        return await self._page("'uncertain'", after_seq, limit)

    async def dispatchable_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        return await self._page("'prepared', 'failed_safe'", after_seq, limit)

    async def mark_in_flight(self, write_id: WriteId, now: datetime) -> int | None:
        return await self.finish_and_mark(None, write_id, now)

    async def finish_send(self, write_id: WriteId, outcome: LeadState, now: datetime) -> None:
        check_transition(LeadState.IN_FLIGHT, outcome)
        async with self._guard():
            rows = await self._fetchall(
                "UPDATE leads SET state = ?, updated_at = ? "
                "WHERE write_id = ? AND state = 'in_flight' RETURNING seq",
                (outcome.value, to_text(now), write_id),
            )
        if not rows:
            raise IllegalTransition(f"record {write_id} was not in flight")

    async def finish_and_mark(
        self,
        done: tuple[WriteId, LeadState] | None,
        next_write_id: WriteId,
        now: datetime,
    ) -> int | None:
        sql, params = _finish_and_mark_args(done, next_write_id, now)
        async with self._guard():
            rows = await self._fetchall(sql, params)
        return _marked(rows, done, next_write_id)

    @asynccontextmanager
    async def dispatch_steps(self) -> AsyncIterator[BlockingDispatchSteps]:
        conn = await anyio.to_thread.run_sync(connection.open_blocking, self.path)
        steps = BlockingDispatchSteps(conn, self.path)
        try:
            yield steps
        finally:
            steps.close()

    async def record_reconcile(
        self, write_id: WriteId, *, confirmed: bool, note: str | None, now: datetime,
        outcome: str | None = None,
    ) -> None:
        async with self._guard():
            rows = await self._fetchall(
                "UPDATE leads SET reconcile_attempts = reconcile_attempts + 1, "
                "state = CASE WHEN :ok THEN 'confirmed' ELSE state END, "
                "reconcile_note = coalesce(:note, reconcile_note), "
                "last_reconcile = coalesce(:outcome, last_reconcile), "
                "last_reconcile_at = CASE WHEN :outcome IS NULL THEN last_reconcile_at "
                "ELSE :now END, updated_at = :now "
                "WHERE write_id = :write_id AND state = 'uncertain' RETURNING seq",
                {"ok": int(confirmed), "note": note, "outcome": outcome,
                 "now": to_text(now), "write_id": write_id},
            )
        if not rows:
            raise IllegalTransition(f"record {write_id} was not uncertain")
