"""Candidate queries for PostgreSQL (SPEC C1-C4).

The same guarded statements as on SQLite: each WHERE clause repeats the status (and the
rule) it starts from.  Under READ COMMITTED, PostgreSQL re-checks that WHERE clause against
the latest version of a row another transaction changed meanwhile, so whatever committed
first wins and a later statement matches nothing instead of overwriting it.  When a
single-candidate write matches nothing, the candidate is read in the same transaction and
``runner.lifecycle.rules`` says why; the transaction is rolled back, so a refusal changes
nothing.

The sweeps are one UPDATE per rule over the whole table, served by the partial indexes;
the outbox event of every row they change is written by trigger in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from runner.clock import from_text, to_text
from runner.errors import RuleViolation, StoreError
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.candidates_schema import ACTIVE_TERM
from runner.io.storeops import SweepOps
from runner.lifecycle import rules
from runner.lifecycle.model import (
    Candidate,
    CandidateSummary,
    SweepFunction,
    SweepRun,
)
from runner.lifecycle.states import CandidateStatus

#: given the candidate as it is now (None: unknown), why the guarded write matched nothing
Refusal = Callable[[Candidate | None], RuleViolation | None]

_SELECT = """
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT coalesce(json_agg(a.analyst ORDER BY a.seq), '[]')::text
        FROM {s}.candidate_analyses a WHERE a.candidate_id = c.id) AS analysts
FROM {s}.candidates c
"""
_ONE = _SELECT + "WHERE c.id = $1"
_PAGE = _SELECT + "WHERE c.seq > $1 ORDER BY c.seq LIMIT $2"

_ADD = """
INSERT INTO {s}.candidates (id, created_at, expires_at, analysis_deadline, quorum, updated_at)
VALUES ($1, $2, $3, $4, $5, $2)
ON CONFLICT (id) DO NOTHING
RETURNING seq
"""
# the analysis trigger counts it and moves discovered -> analyzing
_ANALYZE = f"""
INSERT INTO {{s}}.candidate_analyses (candidate_id, analyst, analyzed_at)
SELECT id, $2, $3 FROM {{s}}.candidates
WHERE id = $1 AND {ACTIVE_TERM} AND analysis_deadline >= $3 AND created_at <= $3
ON CONFLICT (candidate_id, analyst) DO NOTHING
RETURNING seq
"""
# with quorum, T4 cannot apply, so "unexpired" is exactly "not past expires_at" (T3)
_BEGIN_PROMOTION = f"""
UPDATE {{s}}.candidates
SET status = 'promoting', promotion_locked_at = $2, reason = 'promotion', updated_at = $2
WHERE id = $1 AND {ACTIVE_TERM} AND analyses >= quorum AND expires_at >= $2
  AND created_at <= $2
RETURNING seq
"""
_RECORD_DECISION = """
UPDATE {s}.candidates SET decision_id = $3, reason = 'decision', updated_at = $2
WHERE id = $1 AND status = 'promoting' AND decision_id IS NULL
RETURNING seq
"""
_FINISH_PROMOTION = """
UPDATE {s}.candidates SET status = 'promoted', reason = 'promoted', updated_at = $2
WHERE id = $1 AND status = 'promoting' AND decision_id IS NOT NULL
RETURNING seq
"""
# T3 (past expires_at) or T4 (past analysis_deadline without quorum); both imply
# analysis_deadline < now (T2), the term the partial index candidates_to_expire serves
SWEEP_EXPIRED = f"""
UPDATE {{s}}.candidates
SET status = 'expired',
    reason = CASE WHEN expires_at < $1 THEN 'T3' ELSE 'T4' END,
    updated_at = $1
WHERE {ACTIVE_TERM} AND analysis_deadline < $1
  AND (expires_at < $1 OR analyses < quorum)
"""
RECONCILE_STUCK = """
UPDATE {s}.candidates
SET status = CASE WHEN decision_id IS NOT NULL THEN 'promoted' ELSE 'rejected' END,
    reason = CASE WHEN decision_id IS NOT NULL THEN 'reconciled: decision recorded'
                  ELSE 'reconciled: no decision' END,
    updated_at = $1
WHERE status = 'promoting' AND promotion_locked_at < $2
"""
_RECORD_SWEEP = """
INSERT INTO {s}.candidate_sweep (one, function, at, result) VALUES (1, $1, $2, $3)
ON CONFLICT (one) DO UPDATE
SET function = excluded.function, at = excluded.at, result = excluded.result
"""
_LAST_SWEEP = "SELECT function, at, result FROM {s}.candidate_sweep WHERE one = 1"
_SUMMARY = """
SELECT (SELECT coalesce(json_object_agg(status, n), '{}')::text
        FROM (SELECT status, count(*) AS n FROM {s}.candidates GROUP BY status) AS by_status
       ) AS counts,
       sweep.function, sweep.at, sweep.result
FROM (SELECT 1) AS one LEFT JOIN {s}.candidate_sweep AS sweep ON sweep.one = 1
"""


def row_to_candidate(row: Any) -> Candidate:
    try:
        return Candidate(
            id=row["id"],
            status=CandidateStatus(row["status"]),
            created_at=from_text(row["created_at"]),
            expires_at=from_text(row["expires_at"]),
            analysis_deadline=from_text(row["analysis_deadline"]),
            quorum=row["quorum"],
            promotion_locked_at=(None if row["promotion_locked_at"] is None
                                 else from_text(row["promotion_locked_at"])),
            decision_id=row["decision_id"],
            analysts=tuple(json.loads(row["analysts"])),
        )
    except (ValueError, ValidationError) as exc:
        raise StoreError(f"candidate row {row['id']!r} is not valid: {exc}") from None


def _sweep_run(row: Any) -> SweepRun | None:
    if row is None or row["function"] is None:
        return None
    return SweepRun(function=row["function"], at=from_text(row["at"]),
                    result=json.loads(row["result"]))


class CandidateQueries(PostgresBase, SweepOps):
    async def _read_candidate(self, candidate_id: str) -> Candidate | None:
        rows = await self._fetch(_ONE, candidate_id)
        return row_to_candidate(rows[0]) if rows else None

    async def _guarded(self, sql: str, args: tuple[Any, ...], refusal: Refusal) -> Candidate:
        """Run a guarded single-candidate write (``args[0]`` is the id); on no match,
        raise the rules' refusal (read in the same transaction, then rolled back)."""
        candidate_id = str(args[0])
        async with self._transaction():
            changed = await self._fetch(sql, *args)
            current = await self._read_candidate(candidate_id)
            if not changed:
                raise refusal(current) or rules.changed_meanwhile(candidate_id)
        if current is None:  # candidates are never deleted, so this cannot happen
            raise StoreError(f"candidate {candidate_id!r} vanished after a write")
        return current

    async def _record_sweep(self, function: SweepFunction, now: datetime,
                            result: Mapping[str, object]) -> None:
        text = json.dumps(result, separators=(",", ":"))
        await self._fetch(_RECORD_SWEEP, function, to_text(now), text)

    # -- single-candidate operations ----------------------------------------------------

    async def add_candidate(self, candidate: Candidate) -> Candidate:
        c = candidate
        async with self._guard():
            inserted = await self._fetch(
                _ADD, c.id, to_text(c.created_at), to_text(c.expires_at),
                to_text(c.analysis_deadline), c.quorum)
        if not inserted:
            raise RuleViolation(
                f"candidate {c.id!r} already exists; candidate ids are unique",
                reason="duplicate_candidate",
            )
        return Candidate(id=c.id, created_at=c.created_at, expires_at=c.expires_at,
                         analysis_deadline=c.analysis_deadline, quorum=c.quorum)

    async def analyze_candidate(
        self, candidate_id: str, analyst: str, now: datetime
    ) -> Candidate:
        return await self._guarded(
            _ANALYZE, (candidate_id, analyst, to_text(now)),
            lambda c: rules.analysis_refusal(c, candidate_id, analyst, now),
        )

    async def begin_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        return await self._guarded(
            _BEGIN_PROMOTION, (candidate_id, to_text(now)),
            lambda c: rules.promotion_refusal(c, candidate_id, now),
        )

    async def record_decision(
        self, candidate_id: str, decision_id: str, now: datetime
    ) -> Candidate:
        return await self._guarded(
            _RECORD_DECISION, (candidate_id, to_text(now), decision_id),
            lambda c: rules.decision_refusal(c, candidate_id),
        )

    async def finish_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        return await self._guarded(
            _FINISH_PROMOTION, (candidate_id, to_text(now)),
            lambda c: rules.finish_refusal(c, candidate_id),
        )

    async def get_candidate(self, candidate_id: str) -> Candidate | None:
        async with self._guard():
            return await self._read_candidate(candidate_id)

    async def iter_candidates(self, *, page: int = 1000) -> AsyncIterator[Candidate]:
        after = 0
        while True:
            async with self._guard():
                rows = await self._fetch(_PAGE, after, page)
            for row in rows:
                yield row_to_candidate(row)
            if len(rows) < page:
                return
            after = int(rows[-1]["seq"])

    # -- the sweeps (C4) ------------------------------------------------------------------

    async def _expire(self, now: datetime) -> int:
        return await self._count(SWEEP_EXPIRED, to_text(now))

    async def _reconcile(self, now: datetime) -> int:
        return await self._count(RECONCILE_STUCK, to_text(now),
                                 to_text(rules.stuck_cutoff(now)))

    # -- for status -----------------------------------------------------------------------

    async def last_sweep(self) -> SweepRun | None:
        async with self._guard():
            rows = await self._fetch(_LAST_SWEEP)
        return _sweep_run(rows[0] if rows else None)

    async def candidate_summary(self) -> CandidateSummary:
        async with self._guard():
            (row,) = await self._fetch(_SUMMARY)
        counts = {status: 0 for status in CandidateStatus}
        counts.update({CandidateStatus(s): int(n) for s, n in json.loads(row["counts"]).items()})
        return CandidateSummary(counts=counts, last_sweep=_sweep_run(row))
