"""Candidate queries for SQLite (SPEC C1-C4).

Every write is a guarded statement: its WHERE clause repeats the status (and the rule) it
starts from, so whatever committed first wins and a later statement matches nothing
instead of overwriting it.  When a single-candidate write matches nothing, the candidate
is read in the same ``BEGIN IMMEDIATE`` transaction and ``runner.lifecycle.rules`` says
why; the transaction is rolled back, so a refusal changes nothing.

The sweeps are one UPDATE per rule over the whole table (never a loop over rows in
Python); the outbox event of every row they change is written by trigger in the same
transaction (K3).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import from_text, to_text
from runner.errors import RuleViolation, StoreError
from runner.io.sqlite import connection
from runner.io.sqlite.base import SQLiteBase
from runner.io.sqlite.candidates_schema import ACTIVE_TERM
from runner.io.storeops import SweepOps
from runner.lifecycle.results import (
    CandidateSummary,
    SweepFunction,
    SweepRun,
)
from runner.lifecycle.states import CandidateStatus

if TYPE_CHECKING:
    from runner.lifecycle.model import Candidate

#: given the candidate as it is now (None: unknown), why the guarded write matched nothing
Refusal = Callable[["Candidate | None"], RuleViolation | None]

_SELECT = """
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT json_group_array(analyst) FROM
           (SELECT analyst FROM candidate_analyses a WHERE a.candidate_id = c.id
            ORDER BY a.seq)) AS analysts
FROM candidates c
"""
_ONE = _SELECT + "WHERE c.id = ?"
_PAGE = _SELECT + "WHERE c.seq > ? ORDER BY c.seq LIMIT ?"

_ADD = """
INSERT INTO candidates (id, created_at, expires_at, analysis_deadline, quorum, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO NOTHING
RETURNING seq
"""
# the analysis trigger counts it and moves discovered -> analyzing
_ANALYZE = f"""
INSERT INTO candidate_analyses (candidate_id, analyst, analyzed_at)
SELECT id, :analyst, :now FROM candidates
WHERE id = :id AND {ACTIVE_TERM} AND analysis_deadline >= :now AND created_at <= :now
ON CONFLICT (candidate_id, analyst) DO NOTHING
RETURNING seq
"""
# with quorum, T4 cannot apply, so "unexpired" is exactly "not past expires_at" (T3)
_BEGIN_PROMOTION = f"""
UPDATE candidates
SET status = 'promoting', promotion_locked_at = :now, reason = 'promotion', updated_at = :now
WHERE id = :id AND {ACTIVE_TERM} AND analyses >= quorum AND expires_at >= :now
  AND created_at <= :now
RETURNING seq
"""
_RECORD_DECISION = """
UPDATE candidates SET decision_id = :decision, reason = 'decision', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NULL
RETURNING seq
"""
_FINISH_PROMOTION = """
UPDATE candidates SET status = 'promoted', reason = 'promoted', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NOT NULL
RETURNING seq
"""
# T3 (past expires_at) or T4 (past analysis_deadline without quorum).  Both imply
# analysis_deadline < now (T2), the term the partial index candidates_to_expire serves.
SWEEP_EXPIRED = f"""
UPDATE candidates
SET status = 'expired',
    reason = CASE WHEN expires_at < :now THEN 'T3' ELSE 'T4' END,
    updated_at = :now
WHERE {ACTIVE_TERM} AND analysis_deadline < :now
  AND (expires_at < :now OR analyses < quorum)
"""
RECONCILE_STUCK = """
UPDATE candidates
SET status = CASE WHEN decision_id IS NOT NULL THEN 'promoted' ELSE 'rejected' END,
    reason = CASE WHEN decision_id IS NOT NULL THEN 'reconciled: decision recorded'
                  ELSE 'reconciled: no decision' END,
    updated_at = :now
WHERE status = 'promoting' AND promotion_locked_at < :cutoff
"""
_RECORD_SWEEP = """
INSERT INTO candidate_sweep (one, function, at, result) VALUES (1, ?, ?, ?)
ON CONFLICT (one) DO UPDATE
SET function = excluded.function, at = excluded.at, result = excluded.result
"""
_LAST_SWEEP = "SELECT function, at, result FROM candidate_sweep WHERE one = 1"
_COUNTS = "SELECT status, count(*) FROM candidates GROUP BY status"


def row_to_candidate(row: Sequence[Any]) -> Candidate:
    from pydantic import ValidationError  # built only by commands that read candidates

    from runner.lifecycle.model import Candidate

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


class CandidateQueries(SQLiteBase, SweepOps):
    # -- plumbing ---------------------------------------------------------------------

    async def _named(self, sql: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise connection.translate(exc, "writing candidates") from None

    async def _rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        """Run one write statement; the number of rows it changed (triggers excluded)."""
        try:
            async with self._conn.execute(sql, params) as cursor:
                return int(cursor.rowcount)
        except sqlite3.Error as exc:
            raise connection.translate(exc, "writing candidates") from None

    async def _read_candidate(self, candidate_id: str) -> Candidate | None:
        rows = await self._fetchall(_ONE, (candidate_id,))
        return row_to_candidate(rows[0]) if rows else None

    async def _guarded(self, sql: str, params: dict[str, Any], refusal: Refusal) -> Candidate:
        """Run a guarded single-candidate write; on no match, raise the rules' refusal
        (read in the same transaction, which is then rolled back)."""
        from runner.lifecycle import rules  # not at import: status never needs the rules

        candidate_id = str(params["id"])
        async with self._transaction():
            changed = await self._named(sql, params)
            current = await self._read_candidate(candidate_id)
            if not changed:
                raise refusal(current) or rules.changed_meanwhile(candidate_id)
        if current is None:  # candidates are never deleted, so this cannot happen
            raise StoreError(f"candidate {candidate_id!r} vanished after a write")
        return current

    async def _record_sweep(self, function: SweepFunction, now: datetime,
                            result: Mapping[str, object]) -> None:
        text = json.dumps(result, separators=(",", ":"))
        await self._fetchall(_RECORD_SWEEP, (function, to_text(now), text))

    # -- single-candidate operations ----------------------------------------------------

    async def add_candidate(self, candidate: Candidate) -> Candidate:
        c = candidate
        values = (c.id, to_text(c.created_at), to_text(c.expires_at),
                  to_text(c.analysis_deadline), c.quorum, to_text(c.created_at))
        async with self._guard():
            inserted = await self._fetchall(_ADD, values)
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
        from runner.lifecycle import rules

        return await self._guarded(
            _ANALYZE, {"id": candidate_id, "analyst": analyst, "now": to_text(now)},
            lambda c: rules.analysis_refusal(c, candidate_id, analyst, now),
        )

    async def begin_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        from runner.lifecycle import rules

        return await self._guarded(
            _BEGIN_PROMOTION, {"id": candidate_id, "now": to_text(now)},
            lambda c: rules.promotion_refusal(c, candidate_id, now),
        )

    async def record_decision(
        self, candidate_id: str, decision_id: str, now: datetime
    ) -> Candidate:
        from runner.lifecycle import rules

        return await self._guarded(
            _RECORD_DECISION,
            {"id": candidate_id, "decision": decision_id, "now": to_text(now)},
            lambda c: rules.decision_refusal(c, candidate_id),
        )

    async def finish_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        from runner.lifecycle import rules

        return await self._guarded(
            _FINISH_PROMOTION, {"id": candidate_id, "now": to_text(now)},
            lambda c: rules.finish_refusal(c, candidate_id),
        )

    async def get_candidate(self, candidate_id: str) -> Candidate | None:
        async with self._guard():
            return await self._read_candidate(candidate_id)

    async def iter_candidates(self, *, page: int = 1000) -> AsyncIterator[Candidate]:
        after = 0
        while True:
            async with self._guard():
                rows = await self._fetchall(_PAGE, (after, page))
            for row in rows:
                yield row_to_candidate(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])

    # -- the sweeps (C4) ------------------------------------------------------------------

    async def _expire(self, now: datetime) -> int:
        return await self._rowcount(SWEEP_EXPIRED, {"now": to_text(now)})

    async def _reconcile(self, now: datetime) -> int:
        from runner.lifecycle import rules

        cutoff = to_text(rules.stuck_cutoff(now))
        return await self._rowcount(RECONCILE_STUCK, {"now": to_text(now), "cutoff": cutoff})

    # -- for status -----------------------------------------------------------------------

    async def last_sweep(self) -> SweepRun | None:
        async with self._guard():
            rows = await self._fetchall(_LAST_SWEEP)
        return _sweep_run(rows)

    async def candidate_summary(self) -> CandidateSummary:
        async with self._guard():
            counted = await self._fetchall(_COUNTS)
            last = await self._fetchall(_LAST_SWEEP)
        counts = {status: 0 for status in CandidateStatus}
        counts.update({CandidateStatus(status): int(n) for status, n in counted})
        return CandidateSummary(counts=counts, last_sweep=_sweep_run(last))


def _sweep_run(rows: list[sqlite3.Row]) -> SweepRun | None:
    if not rows:
        return None
    function, at, result = rows[0]
    return SweepRun(function=function, at=from_text(at), result=json.loads(result))
