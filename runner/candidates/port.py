"""The candidate part of the Store port: domain operations, not SQL (SPEC C1-C4, K1, K3).

Every operation is one transaction of its own, and every change to a candidate commits
with its ``candidate_changed`` outbox event (K3).  A refused operation raises
``RuleViolation`` (exit 65) worded by ``runner.candidates.rules`` and changes nothing.

The three promotion steps are three operations on purpose: each commits before the next
begins, so a process that dies between them leaves evidence (``promoting`` with its lock
time, maybe a ``decision_id``) that ``reconcile_stuck_promoting`` resolves (K5: resolve
by evidence).

The sweeps are set-based: one guarded UPDATE per rule, whose WHERE clause repeats the
status the rule starts from, so a transition that committed first is never overwritten.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from runner.candidates.results import (
    CandidateSummary,
    ExpireResult,
    ReconcileResult,
    SweepResult,
    SweepRun,
)

if TYPE_CHECKING:
    from runner.candidates.model import Candidate


class CandidateSweeper(Protocol):
    """The one operation the scheduled sweep needs (``runner.tasks.sweep``)."""

    async def sweep_candidates(self, now: datetime) -> SweepResult:
        """sweepCandidates: ``sweep_expired`` then ``reconcile_stuck_promoting`` in one
        transaction, recorded as the store's last sweep."""
        ...


class CandidateStore(CandidateSweeper, Protocol):
    async def add_candidate(self, candidate: Candidate) -> Candidate:
        """Insert a new discovered candidate (built by ``rules.new_candidate``); an id
        that exists already is refused (``duplicate_candidate``)."""
        ...

    async def analyze_candidate(
        self, candidate_id: str, analyst: str, now: datetime
    ) -> Candidate:
        """Record one analysis by a distinct analyst, before the analysis deadline; the
        first one moves the candidate from discovered to analyzing."""
        ...

    async def begin_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        """Step 1 of C3: with quorum and unexpired at ``now``, mark ``promoting`` with
        ``promotion_locked_at = now``.  An expired candidate is never promoted."""
        ...

    async def record_decision(
        self, candidate_id: str, decision_id: str, now: datetime
    ) -> Candidate:
        """Step 2 of C3: record the decision of a promoting candidate (once)."""
        ...

    async def finish_promotion(self, candidate_id: str, now: datetime) -> Candidate:
        """Step 3 of C3: a promoting candidate with its decision becomes promoted."""
        ...

    async def get_candidate(self, candidate_id: str) -> Candidate | None: ...

    def iter_candidates(self, *, page: int = 1000) -> AsyncIterator[Candidate]:
        """Every candidate in creation order, streamed (use inside ``reading()`` for one
        consistent snapshot)."""
        ...

    async def sweep_expired(self, now: datetime) -> ExpireResult:
        """sweepExpired: T3 and T4 candidates become expired; ``{"expired": n}``."""
        ...

    async def reconcile_stuck_promoting(self, now: datetime) -> ReconcileResult:
        """reconcileStuckPromoting: promoting with ``promotion_locked_at < now - 60 s``
        becomes promoted (a decision is recorded) or rejected (none);
        ``{"reconciled": n}``."""
        ...

    async def last_sweep(self) -> SweepRun | None:
        """The last sweep this store ran, by any process."""
        ...

    async def candidate_summary(self) -> CandidateSummary:
        """Counts per status (zeros included) and the last sweep, for ``status``."""
        ...
