"""The candidate lifecycle (SPEC C1-C4), written once over the connection port.

Every write is a guarded statement: its WHERE clause repeats the status (and the rule) it
starts from, so whatever committed first wins and a later statement matches nothing
instead of overwriting it (on PostgreSQL, READ COMMITTED re-checks that clause against the
latest version of a row another transaction changed meanwhile).  When a single-candidate
write matches nothing, the candidate is read in the same transaction and
``runner.candidates.rules`` says why; the transaction is rolled back, so a refusal changes
nothing.

The sweeps are one UPDATE per rule over the whole table (never a loop over rows in
Python), served by the partial indexes; the outbox event of every row they change is
written by trigger in the same transaction (K3).  Each sweep is one transaction, its run
recorded for ``status``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from runner.candidates.results import (
    CandidateSummary,
    ExpireResult,
    ReconcileResult,
    SweepFunction,
    SweepResult,
    SweepRun,
)
from runner.candidates.states import CandidateStatus
from runner.clock import from_text, to_text
from runner.errors import RuleViolation, StoreError
from runner.io.engine.base import Db, Row

if TYPE_CHECKING:
    # built only by the commands that read candidates: status never builds a model
    from runner.candidates.model import Candidate

# not imported here: ``status`` (candidate_summary) loads neither the rules nor the crash
# points (tests/test_startup_imports.py), so the operations that use them import them

#: given the candidate as it is now (None: unknown), why the guarded write matched nothing
Refusal = Callable[["Candidate | None"], RuleViolation | None]


def row_to_candidate(row: Row) -> Candidate:
    """A ``candidate``/``candidates_page`` row: seq, id, status, created_at, expires_at,
    analysis_deadline, quorum, promotion_locked_at, decision_id, analysts (JSON)."""
    from pydantic import ValidationError

    from runner.candidates.model import Candidate

    try:
        return Candidate(
            id=row[1],
            status=CandidateStatus(row[2]),
            created_at=from_text(row[3]),
            expires_at=from_text(row[4]),
            analysis_deadline=from_text(row[5]),
            quorum=row[6],
            promotion_locked_at=None if row[7] is None else from_text(row[7]),
            decision_id=row[8],
            analysts=tuple(json.loads(row[9])),
        )
    except (ValueError, ValidationError) as exc:
        raise StoreError(f"candidate row {row[1]!r} is not valid: {exc}") from None


class CandidateOps(Db):
    # -- plumbing ---------------------------------------------------------------------

    async def _read_candidate(self, candidate_id: str) -> Candidate | None:
        rows = await self.fetch("candidate", id=candidate_id)
        return row_to_candidate(rows[0]) if rows else None

    async def _guarded(self, candidate_id: str, write: Callable[[], Awaitable[Sequence[Row]]],
                       refusal: Refusal) -> Candidate:
        """Run a guarded single-candidate write (the rows it returns: what it changed); on
        no match, raise the rules' refusal (read in the same transaction, then rolled
        back)."""
        from runner.candidates import rules

        async with self.transaction():
            changed = await write()
            current = await self._read_candidate(candidate_id)
            if not changed:
                raise refusal(current) or rules.changed_meanwhile(candidate_id)
        if current is None:  # candidates are never deleted, so this cannot happen
            raise StoreError(f"candidate {candidate_id!r} vanished after a write")
        return current

    async def _record_sweep(self, function: SweepFunction, now: datetime,
                            result: Mapping[str, object]) -> None:
        await self.fetch("record_candidate_sweep", function=function, at=to_text(now),
                         result=json.dumps(result, separators=(",", ":")))

    # -- single-candidate operations ----------------------------------------------------

    async def add_candidate(self, candidate: Candidate) -> Candidate:
        c = candidate
        inserted = await self.fetch(
            "add_candidate", id=c.id, created_at=to_text(c.created_at),
            expires_at=to_text(c.expires_at), analysis_deadline=to_text(c.analysis_deadline),
            quorum=c.quorum)
        if not inserted:
            raise RuleViolation(
                f"candidate {c.id!r} already exists; candidate ids are unique",
                reason="duplicate_candidate",
            )
        return type(c)(id=c.id, created_at=c.created_at, expires_at=c.expires_at,
                       analysis_deadline=c.analysis_deadline, quorum=c.quorum)

    async def analyze_candidate(
        self, candidate_id: str, analyst: str, now: datetime
    ) -> Candidate:
        from runner.candidates import rules

        return await self._guarded(
            candidate_id,
            lambda: self.fetch("analyze_candidate", id=candidate_id, analyst=analyst,
                               now=to_text(now)),
            lambda c: rules.analysis_refusal(c, candidate_id, analyst, now),
        )

    async def begin_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        from runner.candidates import rules

        return await self._guarded(
            candidate_id,
            lambda: self.fetch("begin_promotion", id=candidate_id, now=to_text(now)),
            lambda c: rules.promotion_refusal(c, candidate_id, now),
        )

    async def record_decision(
        self, candidate_id: str, decision_id: str, now: datetime
    ) -> Candidate:
        from runner.candidates import rules

        return await self._guarded(
            candidate_id,
            lambda: self.fetch("record_decision", id=candidate_id, decision=decision_id,
                               now=to_text(now)),
            lambda c: rules.decision_refusal(c, candidate_id),
        )

    async def finish_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        from runner.candidates import rules

        return await self._guarded(
            candidate_id,
            lambda: self.fetch("finish_promotion", id=candidate_id, now=to_text(now)),
            lambda c: rules.finish_refusal(c, candidate_id),
        )

    async def get_candidate(self, candidate_id: str) -> Candidate | None:
        return await self._read_candidate(candidate_id)

    async def iter_candidates(self, *, page: int = 1000) -> AsyncIterator[Candidate]:
        after = 0
        while True:
            rows = await self.fetch("candidates_page", after=after, page=page)
            for row in rows:
                yield row_to_candidate(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])

    # -- the sweeps (C4) ------------------------------------------------------------------

    async def _expire(self, now: datetime) -> int:
        return await self.execute("expire_candidates", now=to_text(now))

    async def _reconcile(self, now: datetime) -> int:
        from runner.candidates import rules

        return await self.execute("reconcile_stuck_promoting", now=to_text(now),
                                  cutoff=to_text(rules.stuck_cutoff(now)))

    async def sweep_expired(self, now: datetime) -> ExpireResult:
        async with self.transaction():
            result = ExpireResult(expired=await self._expire(now))
            await self._record_sweep("sweepExpired", now, result)
        return result

    async def reconcile_stuck_promoting(self, now: datetime) -> ReconcileResult:
        async with self.transaction():
            result = ReconcileResult(reconciled=await self._reconcile(now))
            await self._record_sweep("reconcileStuckPromoting", now, result)
        return result

    async def sweep_candidates(self, now: datetime) -> SweepResult:
        from runner import crashpoints

        async with self.transaction():
            expired = await self._expire(now)
            result = SweepResult(expired=expired, reconciled=await self._reconcile(now))
            await self._record_sweep("sweepCandidates", now, result)
            crashpoints.hit("sweep.before-commit")  # written, not committed
        crashpoints.hit("sweep.after-commit")
        return result

    # -- for status -----------------------------------------------------------------------

    async def last_sweep(self) -> SweepRun | None:
        return (await self.candidate_summary()).last_sweep

    async def candidate_summary(self) -> CandidateSummary:
        (row,) = await self.fetch("candidate_summary")
        counts = {status: 0 for status in CandidateStatus}
        counts.update({CandidateStatus(s): int(n) for s, n in json.loads(row[0]).items()})
        function, at, result = row[1], row[2], row[3]
        last = None if function is None else SweepRun(
            function=function, at=from_text(at), result=json.loads(result))
        return CandidateSummary(counts=counts, last_sweep=last)
