"""The lifecycle rules as pure functions of a candidate and ``now`` (SPEC C2, C3, C4).

Decide in pure code, enforce in the store: the SQL adapters carry the same predicates in
the WHERE clauses of their guarded UPDATEs (a sweep never overwrites a transition that won
a race), and when a guarded write matches nothing they ask these functions *why*, so the
refusal a user sees is worded in one place for every backend.

Deadlines are strict: a candidate is past a deadline when ``deadline < now``; at the very
instant of its deadline it is still in time.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from runner.candidates.results import DEFAULT_QUORUM
from runner.candidates.states import ACTIVE, CandidateStatus
from runner.clock import to_text
from runner.errors import RuleViolation

if TYPE_CHECKING:
    # the model is imported where a candidate is built, so that reading a store (status)
    # never builds pydantic models
    from runner.candidates.model import Candidate

#: T1: a candidate expires this long after it was created, unless told otherwise
DEFAULT_TTL = timedelta(minutes=30)
#: C4: a promotion locked longer ago than this is stuck and resolved by its evidence
STUCK_AFTER = timedelta(seconds=60)

ExpiryRule = Literal["T3", "T4"]
S = CandidateStatus


def is_past(deadline: datetime, now: datetime) -> bool:
    """Strict: ``deadline < now``."""
    return deadline < now


def new_candidate(
    candidate_id: str,
    now: datetime,
    *,
    quorum: int = DEFAULT_QUORUM,
    ttl: timedelta | None = None,
    analysis_deadline: datetime | None = None,
) -> Candidate:
    """A discovered candidate created at ``now`` (T1), refused if it breaks T2."""
    from pydantic import ValidationError

    from runner.candidates.model import Candidate
    from runner.leads.models import describe_validation_error

    ttl = DEFAULT_TTL if ttl is None else ttl
    if ttl <= timedelta(0):
        raise RuleViolation("the time to live must be positive", reason="invalid_ttl")
    expires_at = now + ttl
    deadline = expires_at if analysis_deadline is None else analysis_deadline
    if deadline > expires_at:
        raise RuleViolation(
            f"T2: analysis_deadline {to_text(deadline)} is after expires_at "
            f"{to_text(expires_at)}; it must be on or before it",
            reason="t2_violation",
        )
    if deadline < now:
        raise RuleViolation(
            f"analysis_deadline {to_text(deadline)} is before the candidate is created "
            f"({to_text(now)}); it could never be analyzed",
            reason="deadline_in_past",
        )
    try:
        return Candidate(
            id=candidate_id, created_at=now, expires_at=expires_at,
            analysis_deadline=deadline, quorum=quorum,
        )
    except ValidationError as exc:
        raise RuleViolation(
            f"invalid candidate: {describe_validation_error(exc)}", reason="invalid_candidate"
        ) from None


def expiry_rule(candidate: Candidate, now: datetime) -> ExpiryRule | None:
    """Which rule expires this candidate at ``now``, if any.

    T3: past ``expires_at`` while discovered or analyzing.  T4: past
    ``analysis_deadline`` without quorum.  Promoting candidates passed the expiry gate
    when their lock committed (their decision decides, C4); promoted, rejected and
    expired ones are never looked at again (T5, T6).
    """
    if candidate.status not in ACTIVE:
        return None
    if is_past(candidate.expires_at, now):
        return "T3"
    if is_past(candidate.analysis_deadline, now) and not candidate.has_quorum:
        return "T4"
    return None


def stuck_cutoff(now: datetime) -> datetime:
    """A promotion locked before this instant is stuck (``locked_at < now - 60 s``)."""
    return now - STUCK_AFTER


def reconcile_outcome(candidate: Candidate, now: datetime) -> CandidateStatus | None:
    """Resolve a stuck promotion by evidence: a recorded decision promotes, none rejects."""
    if candidate.status is not S.PROMOTING or candidate.promotion_locked_at is None:
        return None
    if not is_past(candidate.promotion_locked_at, stuck_cutoff(now)):
        return None
    return S.PROMOTED if candidate.decision_id is not None else S.REJECTED


# -- why an operation is refused --------------------------------------------------------


def unknown(candidate_id: str) -> RuleViolation:
    return RuleViolation(f"no candidate {candidate_id!r}", reason="unknown_candidate")


def _status_refusal(candidate: Candidate, doing: str, reason: str) -> RuleViolation:
    extra = {
        S.PROMOTED: f" (decision {candidate.decision_id}); promoted candidates never change",
        S.EXPIRED: "; an expired candidate is never analyzed or promoted",
        S.REJECTED: "; rejected candidates are kept for audit and never change",
        S.PROMOTING: " (its promotion is under way; a promotion stuck for more than 60 s "
                     "is resolved by the sweep)",
    }.get(candidate.status, "")
    reason = "expired" if candidate.status is S.EXPIRED else reason
    return RuleViolation(
        f"cannot {doing} candidate {candidate.id!r}: it is {candidate.status.value}{extra}",
        reason=reason,
    )


def _before_creation(candidate: Candidate, doing: str, now: datetime) -> RuleViolation | None:
    """Time that went backwards: nothing is done to a candidate before it existed."""
    if now >= candidate.created_at:
        return None
    return RuleViolation(
        f"cannot {doing} candidate {candidate.id!r} at {to_text(now)}: it was created at "
        f"{to_text(candidate.created_at)}, later (a clock that went backwards?)",
        reason="before_creation",
    )


def analysis_refusal(
    candidate: Candidate | None, candidate_id: str, analyst: str, now: datetime
) -> RuleViolation | None:
    """Why ``analyst`` may not analyze the candidate at ``now`` (None: they may)."""
    if candidate is None:
        return unknown(candidate_id)
    if (early := _before_creation(candidate, "analyze", now)) is not None:
        return early
    if analyst in candidate.analysts:
        return RuleViolation(
            f"analyst {analyst!r} already analyzed candidate {candidate.id!r}; "
            "the quorum counts distinct analysts",
            reason="duplicate_analyst",
        )
    if candidate.status not in ACTIVE:
        return _status_refusal(candidate, "analyze", "not_analyzable")
    if is_past(candidate.analysis_deadline, now):
        return RuleViolation(
            f"cannot analyze candidate {candidate.id!r}: its analysis_deadline "
            f"{to_text(candidate.analysis_deadline)} has passed",
            reason="past_deadline",
        )
    return None


def promotion_refusal(
    candidate: Candidate | None, candidate_id: str, now: datetime
) -> RuleViolation | None:
    """Why the candidate may not start its promotion at ``now`` (None: it may).

    The order matters only for the message; every refusal changes nothing.
    """
    if candidate is None:
        return unknown(candidate_id)
    if (early := _before_creation(candidate, "promote", now)) is not None:
        return early
    if candidate.status not in ACTIVE:
        return _status_refusal(candidate, "promote", "not_promotable")
    rule = expiry_rule(candidate, now)
    if rule == "T3":
        return RuleViolation(
            f"cannot promote candidate {candidate.id!r}: it expired at "
            f"{to_text(candidate.expires_at)} (T3); an expired candidate is never promoted",
            reason="expired",
        )
    if not candidate.has_quorum:
        late = " and its analysis_deadline has passed (T4)" if rule == "T4" else ""
        return RuleViolation(
            f"cannot promote candidate {candidate.id!r}: it has {candidate.analyses} of "
            f"{candidate.quorum} analyses needed{late}",
            reason="expired" if rule == "T4" else "no_quorum",
        )
    return None


def decision_refusal(
    candidate: Candidate | None, candidate_id: str
) -> RuleViolation | None:
    """Why a decision may not be recorded (only once, only while promoting)."""
    if candidate is None:
        return unknown(candidate_id)
    if candidate.status is not S.PROMOTING:
        return _status_refusal(candidate, "record a decision for", "not_promoting")
    if candidate.decision_id is not None:
        return RuleViolation(
            f"candidate {candidate.id!r} already has decision {candidate.decision_id!r}",
            reason="decision_recorded",
        )
    return None


def finish_refusal(candidate: Candidate | None, candidate_id: str) -> RuleViolation | None:
    """Why a promotion may not be completed (it needs its recorded decision)."""
    if candidate is None:
        return unknown(candidate_id)
    if candidate.status is not S.PROMOTING:
        return _status_refusal(candidate, "finish promoting", "not_promoting")
    if candidate.decision_id is None:
        return RuleViolation(
            f"cannot finish promoting candidate {candidate.id!r}: no decision is recorded",
            reason="no_decision",
        )
    return None


def changed_meanwhile(candidate_id: str) -> RuleViolation:
    """A guarded write matched nothing although the rules allow it: the candidate changed
    between the write and the read that explains it (not possible inside one SQLite
    write transaction; kept for backends with weaker isolation)."""
    return RuleViolation(
        f"candidate {candidate_id!r} changed meanwhile; nothing was changed, try again",
        reason="conflict",
    )


def check_name(value: str, what: str) -> str:
    """An id given on the command line (candidate, analyst, decision): non-empty, bounded."""
    if not value or len(value) > 512:
        raise RuleViolation(
            f"{what} must be a non-empty string of at most 512 characters",
            reason="invalid_candidate",
        )
    return value
