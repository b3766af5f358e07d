"""Operator queries for SQLite (SPEC E5, issue 19): list uncertain records, look one up
by write_id, and record a decision.

A decision is two statements in one ``BEGIN IMMEDIATE`` transaction: the decision row
(whose trigger writes the ``operator_resolved`` event) and the record's move out of
uncertain, guarded by its state and ``attempts``.  The schema refuses ``uncertain ->
failed_safe`` without that decision row, so the order matters and both commit or neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.sqlite.base import SQLiteBase
from runner.states import IllegalTransition, LeadState, check_transition
from runner.storedata import UncertainRow

if TYPE_CHECKING:
    from runner.storework import Decision, ResolveSubject

#: how many decisions ``status`` shows, newest first
DECISIONS_SHOWN = 20

_UNCERTAIN = (
    "SELECT seq, source_lead_id, write_id, attempts, reconcile_attempts, uncertain_since, "
    "last_reconcile, last_reconcile_at FROM leads "
    "WHERE state = 'uncertain' AND seq > ? ORDER BY seq LIMIT ?"
)
_SUBJECT = (
    "SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts "
    "FROM leads WHERE write_id = ?"
)
_DECIDE = (
    "INSERT INTO operator_decisions (tenant_id, source_lead_id, write_id, decision, reason, "
    "readback, attempts, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_MOVE = (
    "UPDATE leads SET state = ?, updated_at = ? "
    "WHERE write_id = ? AND state = 'uncertain' AND attempts = ? RETURNING seq"
)
_RECENT = (
    "SELECT id, source_lead_id, write_id, decision, reason, readback, attempts, decided_at "
    "FROM operator_decisions ORDER BY id DESC LIMIT ?"
)


def uncertain_row(row: Sequence[Any]) -> UncertainRow:
    return UncertainRow(
        seq=int(row[0]), source_lead_id=str(row[1]), write_id=WriteId(str(row[2])),
        attempts=int(row[3]), reconcile_attempts=int(row[4]), uncertain_since=row[5],
        last_reconcile=row[6], last_reconcile_at=row[7])


def decision_json(row: Sequence[Any]) -> dict[str, Any]:
    return {"id": int(row[0]), "source_lead_id": row[1], "write_id": row[2],
            "decision": row[3], "reason": row[4], "readback": row[5],
            "attempts": int(row[6]), "at": row[7]}


class OperatorQueries(SQLiteBase):
    async def uncertain_records(self, after_seq: int, limit: int) -> list[UncertainRow]:
        async with self._guard():
            rows = await self._fetchall(_UNCERTAIN, (after_seq, limit))
        return [uncertain_row(r) for r in rows]

    async def resolve_subject(self, write_id: WriteId) -> ResolveSubject | None:
        from runner.io.engine.delivery import lead_work as _work
        from runner.storework import ResolveSubject

        async with self._guard():
            rows = await self._fetchall(_SUBJECT, (write_id,))
        if not rows:
            return None
        row = rows[0]
        return ResolveSubject(work=_work(row[:5]), tenant_id=str(row[5]), attempts=int(row[6]))

    async def record_operator_decision(self, decision: Decision, now: datetime) -> None:
        check_transition(LeadState.UNCERTAIN, decision.to_state)
        at = to_text(now)
        async with self._transaction():
            await self._fetchall(_DECIDE, (
                decision.tenant_id, decision.source_lead_id, decision.write_id,
                decision.decision, decision.reason, decision.readback, decision.attempts, at))
            moved = await self._fetchall(_MOVE, (decision.to_state.value, at,
                                                 decision.write_id, decision.attempts))
            if not moved:  # rolls the decision back too
                raise IllegalTransition(
                    f"record {decision.write_id} is no longer uncertain at attempts "
                    f"{decision.attempts}")

    async def recent_decisions(self) -> list[dict[str, Any]]:
        async with self._guard():
            rows = await self._fetchall(_RECENT, (DECISIONS_SHOWN,))
        return [decision_json(r) for r in rows]
