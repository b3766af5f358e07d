"""The lifecycle rules as pure functions of ``now`` (C2 T1-T4, C3, C4): no store, no sleep."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from runner.candidates import Candidate, CandidateStatus, rules
from runner.candidates.states import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    IllegalCandidateTransition,
    allowed_pairs,
    check_transition,
)
from runner.errors import RuleViolation
from tests.lifecycle_fixtures import T0, at

S = CandidateStatus
US = timedelta(microseconds=1)


def cand(status: S = S.DISCOVERED, analysts: tuple[str, ...] = (), **kw: object) -> Candidate:
    """A validated candidate in any state (the model's invariants apply)."""
    base = rules.new_candidate("c1", T0).model_dump()
    return Candidate.model_validate({**base, "status": status, "analysts": analysts, **kw})


# -- T1, T2: creation -----------------------------------------------------------------


def test_t1_defaults_expiry_30_minutes_and_deadline_equal_to_expiry() -> None:
    c = rules.new_candidate("c1", T0)
    assert c.status is S.DISCOVERED and c.created_at == T0
    assert c.expires_at == at(minutes=30)
    assert c.analysis_deadline == c.expires_at
    assert c.quorum == 2 and c.analysts == () and c.decision_id is None


def test_t1_ttl_quorum_and_deadline_may_be_given() -> None:
    c = rules.new_candidate("c1", T0, quorum=3, ttl=timedelta(minutes=10),
                            analysis_deadline=at(minutes=4))
    assert (c.expires_at, c.analysis_deadline, c.quorum) == (at(minutes=10), at(minutes=4), 3)


def test_t2_a_deadline_after_expiry_is_refused_with_exit_65() -> None:
    with pytest.raises(RuleViolation) as info:
        rules.new_candidate("c1", T0, analysis_deadline=at(minutes=30) + US)
    assert info.value.exit_code == 65 and info.value.reason == "t2_violation"
    assert "T2" in info.value.message and "on or before" in info.value.message


def test_t2_a_deadline_equal_to_expiry_is_allowed() -> None:
    assert rules.new_candidate("c1", T0, analysis_deadline=at(minutes=30)).analysis_deadline \
        == at(minutes=30)


def test_t2_holds_in_the_model_itself() -> None:
    with pytest.raises(ValidationError):
        Candidate(id="c1", created_at=T0, expires_at=at(1), analysis_deadline=at(2))


@pytest.mark.parametrize("kwargs", [
    {"analysis_deadline": T0 - US},        # before creation: could never be analyzed
    {"ttl": timedelta(0)},
    {"quorum": 0},
])
def test_other_impossible_candidates_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(RuleViolation):
        rules.new_candidate("c1", T0, **kwargs)  # type: ignore[arg-type]


def test_analysts_are_distinct() -> None:
    with pytest.raises(ValidationError):
        cand(S.ANALYZING, ("a1", "a1"))
    assert cand(S.ANALYZING, ("a1", "a2")).has_quorum


# -- strict deadlines, T3, T4 -----------------------------------------------------------


def test_deadlines_are_strict() -> None:
    assert not rules.is_past(T0, T0)
    assert rules.is_past(T0, T0 + US)


def test_t3_past_expiry_in_discovered_or_analyzing_expires() -> None:
    expiry = at(minutes=30)
    for status, analysts in ((S.DISCOVERED, ()), (S.ANALYZING, ("a1", "a2"))):
        c = cand(status, analysts)
        assert rules.expiry_rule(c, expiry) is None          # at the deadline: in time
        assert rules.expiry_rule(c, expiry + US) == "T3"     # strictly after: expired


def test_t4_past_the_analysis_deadline_without_quorum_expires() -> None:
    c = cand(S.ANALYZING, ("a1",), analysis_deadline=at(minutes=10))
    assert rules.expiry_rule(c, at(minutes=10)) is None
    assert rules.expiry_rule(c, at(minutes=10) + US) == "T4"
    with_quorum = cand(S.ANALYZING, ("a1", "a2"), analysis_deadline=at(minutes=10))
    assert rules.expiry_rule(with_quorum, at(minutes=20)) is None  # T4 needs no quorum
    assert rules.expiry_rule(with_quorum, at(minutes=31)) == "T3"


@pytest.mark.parametrize("status", [S.PROMOTING, S.PROMOTED, S.REJECTED, S.EXPIRED])
def test_only_discovered_and_analyzing_are_ever_expired(status: S) -> None:
    c = cand(status, ("a1", "a2"), promotion_locked_at=T0, decision_id="d1")
    assert rules.expiry_rule(c, at(minutes=10_000)) is None


@given(
    ttl=st.integers(1, 10_000),
    deadline_before=st.integers(0, 10_000),
    analyses=st.integers(0, 3),
    quorum=st.integers(1, 3),
    later=st.integers(-20_000, 20_000),
    status=st.sampled_from(sorted(ACTIVE)),
)
def test_every_expirable_candidate_is_past_its_analysis_deadline(
    ttl: int, deadline_before: int, analyses: int, quorum: int, later: int, status: S
) -> None:
    """T2 makes T3 and T4 imply ``analysis_deadline < now``: the SQL sweep relies on it
    (its partial index is ordered by analysis_deadline)."""
    expires = T0 + timedelta(seconds=ttl)
    c = Candidate(
        id="c1", status=status, created_at=T0, expires_at=expires, quorum=quorum,
        analysis_deadline=max(T0, expires - timedelta(seconds=deadline_before)),
        analysts=tuple(f"a{i}" for i in range(analyses)),
    )
    now = T0 + timedelta(seconds=later)
    if rules.expiry_rule(c, now) is not None:
        assert rules.is_past(c.analysis_deadline, now)


# -- C4: stuck promotions ----------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "decision", "expected"), [
    (59, "d1", None),
    (60, "d1", None),           # strict: locked_at < now - 60 s
    (61, "d1", S.PROMOTED),
    (59, None, None),
    (61, None, S.REJECTED),
])
def test_a_promotion_stuck_more_than_60_s_is_resolved_by_its_evidence(
    seconds: int, decision: str | None, expected: S | None
) -> None:
    c = cand(S.PROMOTING, ("a1", "a2"), promotion_locked_at=T0, decision_id=decision)
    assert rules.reconcile_outcome(c, at(seconds=seconds)) is expected
    assert rules.reconcile_outcome(cand(S.ANALYZING, ("a1", "a2")), at(minutes=5)) is None


# -- C3: promotion refusals ----------------------------------------------------------------


def test_promotion_needs_quorum_and_an_unexpired_candidate() -> None:
    ready = cand(S.ANALYZING, ("a1", "a2"))
    assert rules.promotion_refusal(ready, "c1", at(minutes=30)) is None
    expired_by_time = rules.promotion_refusal(ready, "c1", at(minutes=30) + US)
    assert expired_by_time is not None and expired_by_time.reason == "expired"
    short = rules.promotion_refusal(cand(S.ANALYZING, ("a1",)), "c1", at(1))
    assert short is not None and short.reason == "no_quorum" and "1 of 2" in short.message
    for status in (S.EXPIRED, S.PROMOTED, S.REJECTED, S.PROMOTING):
        refusal = rules.promotion_refusal(
            cand(status, ("a1", "a2"), promotion_locked_at=T0, decision_id="d1"), "c1", at(1))
        assert refusal is not None and refusal.exit_code == 65
    unknown = rules.promotion_refusal(None, "nope", at(1))
    assert unknown is not None and unknown.reason == "unknown_candidate"


def test_an_analysis_needs_a_new_analyst_before_the_deadline() -> None:
    c = cand(S.ANALYZING, ("a1",), analysis_deadline=at(minutes=10))
    assert rules.analysis_refusal(c, "c1", "a2", at(minutes=10)) is None
    late = rules.analysis_refusal(c, "c1", "a2", at(minutes=10) + US)
    assert late is not None and late.reason == "past_deadline"
    again = rules.analysis_refusal(c, "c1", "a1", at(1))
    assert again is not None and again.reason == "duplicate_analyst"


# -- the transition table ---------------------------------------------------------------------


def test_the_transition_table_covers_every_status_and_terminal_ones_are_final() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {S.PROMOTED, S.REJECTED, S.EXPIRED} == TERMINAL
    assert {S.DISCOVERED, S.ANALYZING} == ACTIVE
    assert (S.ANALYZING, S.PROMOTING) in allowed_pairs()
    assert (S.PROMOTING, S.EXPIRED) not in allowed_pairs()  # past the expiry gate


@pytest.mark.parametrize("dst", list(S))
def test_an_expired_candidate_can_move_nowhere(dst: S) -> None:
    with pytest.raises(IllegalCandidateTransition):
        check_transition(S.EXPIRED, dst)
