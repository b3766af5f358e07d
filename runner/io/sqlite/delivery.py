"""Delivery queries for SQLite (SPEC L4-L8).

Each operation is one statement, so one awaited call and one transaction; the outbox
events are written by the schema's triggers in the same transaction.  Every transition
names the state it expects in its WHERE clause: a stale or repeated call updates nothing
instead of moving a record along the wrong edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.sqlite.base import SQLiteBase
from runner.states import IllegalTransition, LeadState, check_transition

if TYPE_CHECKING:
    from runner.storework import LeadWork

_WORK_COLUMNS = "seq, source_lead_id, write_id, state, canonical"


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
        async with self._guard():
            rows = await self._fetchall(
                "UPDATE leads SET state = 'in_flight', attempts = attempts + 1, updated_at = ? "
                "WHERE write_id = ? AND state IN ('prepared', 'failed_safe') RETURNING attempts",
                (to_text(now), write_id),
            )
        return int(rows[0][0]) if rows else None

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
        if done is None:
            return await self.mark_in_flight(next_write_id, now)
        done_id, outcome = done
        check_transition(LeadState.IN_FLIGHT, outcome)
        async with self._guard():
            # one statement, so one commit, for both rows; each row is guarded by the
            # state it must be in, and the triggers write both state_changed events
            rows = await self._fetchall(
                "UPDATE leads SET "
                "state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END, "
                "attempts = attempts + (write_id = :next), updated_at = :now "
                "WHERE (write_id = :done AND state = 'in_flight') "
                "OR (write_id = :next AND state IN ('prepared', 'failed_safe')) "
                "RETURNING write_id, attempts",
                {"next": next_write_id, "done": done_id, "outcome": outcome.value,
                 "now": to_text(now)},
            )
        changed = {str(r[0]): int(r[1]) for r in rows}
        if done_id not in changed:
            raise IllegalTransition(f"record {done_id} was not in flight")
        return changed.get(next_write_id)

    async def record_reconcile(
        self, write_id: WriteId, *, confirmed: bool, note: str | None, now: datetime
    ) -> None:
        async with self._guard():
            rows = await self._fetchall(
                "UPDATE leads SET reconcile_attempts = reconcile_attempts + 1, "
                "state = CASE WHEN ? THEN 'confirmed' ELSE state END, "
                "reconcile_note = coalesce(?, reconcile_note), updated_at = ? "
                "WHERE write_id = ? AND state = 'uncertain' RETURNING seq",
                (int(confirmed), note, to_text(now), write_id),
            )
        if not rows:
            raise IllegalTransition(f"record {write_id} was not uncertain")
