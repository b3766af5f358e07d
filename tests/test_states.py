from __future__ import annotations

import pytest

from runner.leads.states import TRANSITIONS, IllegalTransition, LeadState, check_transition

S = LeadState


def test_state_spellings_match_the_spec() -> None:
    assert [s.value for s in LeadState] == [
        "prepared", "in_flight", "confirmed", "failed_safe", "uncertain",
        "confirmed_then_missing",
    ]


def test_transition_table_is_exactly_l4() -> None:
    edges = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == {
        (S.PREPARED, S.IN_FLIGHT),
        (S.IN_FLIGHT, S.CONFIRMED),
        (S.IN_FLIGHT, S.FAILED_SAFE),
        (S.IN_FLIGHT, S.UNCERTAIN),
        (S.FAILED_SAFE, S.IN_FLIGHT),
        (S.UNCERTAIN, S.CONFIRMED),
        # only by an operator's recorded not-sent decision (issue 19; the store checks it)
        (S.UNCERTAIN, S.FAILED_SAFE),
        (S.CONFIRMED, S.CONFIRMED_THEN_MISSING),
    }


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.UNCERTAIN, S.IN_FLIGHT),  # never a second send of an uncertain record
        (S.PREPARED, S.CONFIRMED),
        (S.CONFIRMED_THEN_MISSING, S.PREPARED),
        (S.CONFIRMED, S.IN_FLIGHT),
    ],
)
def test_illegal_transitions_raise(src: LeadState, dst: LeadState) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(src, dst)
