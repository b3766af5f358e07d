"""Operators (SPEC E5, issue 19): list uncertain records, look one up by write_id, and
record a decision.

A decision is two statements in one transaction: the decision row (whose trigger writes
the ``operator_resolved`` event), then the record's move out of uncertain, guarded by its
state and ``attempts``.  The schema refuses ``uncertain -> failed_safe`` without that
decision row, so the order matters, and both commit or neither.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.engine.db import Db
from runner.io.engine.delivery import lead_work
from runner.leads.states import IllegalTransition, LeadState, check_transition
from runner.storedata import UncertainRow

if TYPE_CHECKING:
    from runner.storedata import Decision, ResolveSubject


class OperatorOps(Db):
    async def uncertain_records(self, after_seq: int, limit: int) -> list[UncertainRow]:
        rows = await self.fetch("uncertain_records", after_seq=after_seq, limit=limit)
        return [UncertainRow(
            seq=int(r[0]), source_lead_id=str(r[1]), write_id=WriteId(str(r[2])),
            attempts=int(r[3]), reconcile_attempts=int(r[4]), uncertain_since=r[5],
            last_reconcile=r[6], last_reconcile_at=r[7]) for r in rows]

    async def resolve_subject(self, write_id: WriteId) -> ResolveSubject | None:
        from runner.storedata import ResolveSubject

        rows = await self.fetch("resolve_subject", write_id=write_id)
        if not rows:
            return None
        row = rows[0]  # seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
        return ResolveSubject(work=lead_work(row), tenant_id=str(row[5]),
                              attempts=int(row[6]))

    async def record_operator_decision(self, decision: Decision, now: datetime) -> None:
        check_transition(LeadState.UNCERTAIN, decision.to_state)
        at = to_text(now)
        async with self.transaction():
            await self.fetch(
                "record_operator_decision", tenant_id=decision.tenant_id,
                source_lead_id=decision.source_lead_id, write_id=decision.write_id,
                decision=decision.decision, reason=decision.reason,
                readback=decision.readback, attempts=decision.attempts, at=at)
            moved = await self.fetch(
                "leave_uncertain", state=decision.to_state.value, at=at,
                write_id=decision.write_id, attempts=decision.attempts)
            if not moved:  # rolls the decision back too
                raise IllegalTransition(
                    f"record {decision.write_id} is no longer uncertain at attempts "
                    f"{decision.attempts}")
