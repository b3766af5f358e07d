"""Delivery queries for PostgreSQL (SPEC L4-L8).

Each operation is one statement, so one round trip and one transaction; the outbox events
are written by the schema's triggers in the same transaction.  Every transition names the
state it expects in its WHERE clause: a stale or repeated call updates nothing instead of
moving a record along the wrong edge (the row lock an UPDATE takes makes the check and
the change one step, also against a concurrent writer).

The in-flight mark also checks the worker lock's fence while this store holds the lock
(see ``runner.io.postgres.lock``): if the lock's session has ended, nothing is marked and
the send does not start.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from runner.clock import to_text
from runner.errors import LockLost
from runner.ids import WriteId
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.lock import fence_held
from runner.io.storeops import LoopDispatchSteps, loop_dispatch_steps
from runner.states import IllegalTransition, LeadState, check_transition
from runner.storedata import LeadWork

_PAGE = """
SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
WHERE state = ANY($1::text[]) AND seq > $2 ORDER BY seq LIMIT $3
"""
_MARK = """
UPDATE {s}.leads SET state = 'in_flight', attempts = attempts + 1, updated_at = $1
WHERE write_id = $2 AND state IN ('prepared', 'failed_safe')
RETURNING attempts
"""
_MARK_FENCED = f"""
WITH fence AS (SELECT {fence_held("$3", "$4", "$5")} AS held),
marked AS (
    UPDATE {{s}}.leads SET state = 'in_flight', attempts = attempts + 1, updated_at = $1
    WHERE write_id = $2 AND state IN ('prepared', 'failed_safe')
      AND (SELECT held FROM fence)
    RETURNING attempts
)
SELECT (SELECT held FROM fence) AS held, (SELECT attempts FROM marked) AS attempts
"""
_FINISH = """
UPDATE {s}.leads SET state = $1, updated_at = $2
WHERE write_id = $3 AND state = 'in_flight' RETURNING seq
"""
# one statement, so one commit, for both rows: the outcome of the send that finished and
# the in-flight mark of the next one; each row guarded by the state it must be in; the
# triggers write both events.  With the worker lock held, nothing at all changes once the
# lock's session is gone (the caller then records the outcome alone, with finish_send)
_FINISH_AND_MARK = """
WITH fence AS (SELECT {fence} AS held),
changed AS (
    UPDATE {{s}}.leads SET
        state = CASE WHEN write_id = $2 THEN 'in_flight' ELSE $4 END,
        attempts = attempts + CASE WHEN write_id = $2 THEN 1 ELSE 0 END,
        updated_at = $1
    WHERE (SELECT held FROM fence)
      AND ((write_id = $3 AND state = 'in_flight')
           OR (write_id = $2 AND state IN ('prepared', 'failed_safe')))
    RETURNING write_id, attempts
)
SELECT (SELECT held FROM fence) AS held,
       (SELECT coalesce(json_object_agg(write_id, attempts), '{{}}')::text FROM changed)
       AS changed
"""
_FINISH_AND_MARK_PLAIN = _FINISH_AND_MARK.format(fence="true")
_FINISH_AND_MARK_FENCED = _FINISH_AND_MARK.format(fence=fence_held("$5", "$6", "$7"))
_RECONCILE = """
UPDATE {s}.leads SET reconcile_attempts = reconcile_attempts + 1,
    state = CASE WHEN $1 THEN 'confirmed' ELSE state END,
    reconcile_note = coalesce($2, reconcile_note),
    last_reconcile = coalesce($5::text, last_reconcile),
    last_reconcile_at = CASE WHEN $5::text IS NULL THEN last_reconcile_at ELSE $3 END,
    updated_at = $3
WHERE write_id = $4 AND state = 'uncertain' RETURNING seq
"""


def _lock_lost(where: str) -> LockLost:
    return LockLost(f"the worker lock's session at {where} has ended (terminated or timed "
                    "out); not sending, a new run recovers")


def _work(row: Any) -> LeadWork:
    from runner.models import LeadEvent  # the model is built only by commands that deliver

    return LeadWork(
        seq=int(row["seq"]),
        source_lead_id=str(row["source_lead_id"]),
        write_id=WriteId(str(row["write_id"])),
        state=LeadState(row["state"]),
        event=LeadEvent.model_validate_json(row["canonical"]),
    )


class DeliveryQueries(PostgresBase):
    async def pinned_target(self) -> str | None:
        async with self._guard():
            rows = await self._fetch("SELECT target_id FROM {s}.target_pin")
        return str(rows[0]["target_id"]) if rows else None

    async def pin_target(self, target_id: str, now: datetime) -> str:
        # a pin never changes once written (the schema refuses it), so the insert and the
        # read need no common transaction: whatever the read sees is final
        async with self._guard():
            await self._fetch(
                "INSERT INTO {s}.target_pin (target_id, pinned_at) VALUES ($1, $2) "
                "ON CONFLICT (only_row) DO NOTHING", target_id, to_text(now))
            rows = await self._fetch("SELECT target_id FROM {s}.target_pin")
        return str(rows[0]["target_id"])

    async def recover_in_flight(self, now: datetime) -> list[str]:
        async with self._guard():
            rows = await self._fetch(
                "UPDATE {s}.leads SET state = 'uncertain', updated_at = $1 "
                "WHERE state = 'in_flight' RETURNING source_lead_id",
                to_text(now),
            )
        return [str(r["source_lead_id"]) for r in rows]

    async def _page(self, states: list[str], after_seq: int, limit: int) -> list[LeadWork]:
        async with self._guard():
            rows = await self._fetch(_PAGE, states, after_seq, limit)
        return [_work(r) for r in rows]

    async def uncertain_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        return await self._page(["uncertain"], after_seq, limit)

    async def dispatchable_page(self, after_seq: int, limit: int) -> list[LeadWork]:
        return await self._page(["prepared", "failed_safe"], after_seq, limit)

    async def mark_in_flight(self, write_id: WriteId, now: datetime) -> int | None:
        fence = self._fence
        async with self._guard():
            if fence is None:
                rows = await self._fetch(_MARK, to_text(now), write_id)
                return int(rows[0]["attempts"]) if rows else None
            (row,) = await self._fetch(_MARK_FENCED, to_text(now), write_id, *fence.args())
        if not row["held"]:
            raise _lock_lost(self.location.where)
        return None if row["attempts"] is None else int(row["attempts"])

    async def finish_send(self, write_id: WriteId, outcome: LeadState, now: datetime) -> None:
        check_transition(LeadState.IN_FLIGHT, outcome)
        async with self._guard():
            rows = await self._fetch(_FINISH, outcome.value, to_text(now), write_id)
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
        fence = self._fence
        args = (to_text(now), next_write_id, done_id, outcome.value)
        async with self._guard():
            if fence is None:
                (row,) = await self._fetch(_FINISH_AND_MARK_PLAIN, *args)
            else:
                (row,) = await self._fetch(_FINISH_AND_MARK_FENCED, *args, *fence.args())
        if not row["held"]:  # nothing changed: the next send must not start
            raise _lock_lost(self.location.where)
        changed = {str(k): int(v) for k, v in json.loads(row["changed"]).items()}
        if done_id not in changed:
            raise IllegalTransition(f"record {done_id} was not in flight")
        return changed.get(next_write_id)

    def dispatch_steps(self) -> AbstractAsyncContextManager[LoopDispatchSteps]:
        # asyncpg is async: each step hops back to the loop (a network round trip costs
        # more than the hop)
        return loop_dispatch_steps(self)

    async def record_reconcile(
        self, write_id: WriteId, *, confirmed: bool, note: str | None, now: datetime,
        outcome: str | None = None,
    ) -> None:
        async with self._guard():
            rows = await self._fetch(_RECONCILE, confirmed, note, to_text(now), write_id,
                                     outcome)
        if not rows:
            raise IllegalTransition(f"record {write_id} was not uncertain")
