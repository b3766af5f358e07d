"""Operator queries for PostgreSQL (SPEC E5, issue 19), as on SQLite: list uncertain
records, look one up by write_id, and record a decision.

A decision is two statements in one transaction, as on SQLite: the decision row (whose
trigger writes the ``operator_resolved`` event), then the record's move out of uncertain,
guarded by its state and ``attempts``.  The guard trigger refuses ``uncertain ->
failed_safe`` unless that decision row exists, so the order matters and both commit or
neither.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.postgres.base import PostgresBase
from runner.states import IllegalTransition, LeadState, check_transition
from runner.storedata import UncertainRow

if TYPE_CHECKING:
    from runner.storework import Decision, ResolveSubject

_UNCERTAIN = """
SELECT seq, source_lead_id, write_id, attempts, reconcile_attempts, uncertain_since,
       last_reconcile, last_reconcile_at
FROM {s}.leads WHERE state = 'uncertain' AND seq > $1 ORDER BY seq LIMIT $2
"""
_SUBJECT = """
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
FROM {s}.leads WHERE write_id = $1
"""
_DECIDE = """
INSERT INTO {s}.operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                    readback, attempts, decided_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
"""
_MOVE = """
UPDATE {s}.leads SET state = $1, updated_at = $2
WHERE write_id = $3 AND state = 'uncertain' AND attempts = $4 RETURNING seq
"""


def uncertain_row(row: Any) -> UncertainRow:
    return UncertainRow(
        seq=int(row["seq"]), source_lead_id=str(row["source_lead_id"]),
        write_id=WriteId(str(row["write_id"])), attempts=int(row["attempts"]),
        reconcile_attempts=int(row["reconcile_attempts"]),
        uncertain_since=row["uncertain_since"], last_reconcile=row["last_reconcile"],
        last_reconcile_at=row["last_reconcile_at"])


class OperatorQueries(PostgresBase):
    async def uncertain_records(self, after_seq: int, limit: int) -> list[UncertainRow]:
        async with self._guard():
            rows = await self._fetch(_UNCERTAIN, after_seq, limit)
        return [uncertain_row(r) for r in rows]

    async def resolve_subject(self, write_id: WriteId) -> ResolveSubject | None:
        from runner.io.engine.delivery import lead_work as _work
        from runner.storework import ResolveSubject

        async with self._guard():
            rows = await self._fetch(_SUBJECT, write_id)
        if not rows:
            return None
        row = rows[0]
        return ResolveSubject(work=_work(row[:5]), tenant_id=str(row["tenant_id"]),
                              attempts=int(row["attempts"]))

    async def record_operator_decision(self, decision: Decision, now: datetime) -> None:
        check_transition(LeadState.UNCERTAIN, decision.to_state)
        at = to_text(now)
        async with self._transaction():
            await self._fetch(_DECIDE, decision.tenant_id, decision.source_lead_id,
                              decision.write_id, decision.decision, decision.reason,
                              decision.readback, decision.attempts, at)
            moved = await self._fetch(_MOVE, decision.to_state.value, at, decision.write_id,
                                      decision.attempts)
            if not moved:  # rolls the decision back too
                raise IllegalTransition(
                    f"record {decision.write_id} is no longer uncertain at attempts "
                    f"{decision.attempts}")
