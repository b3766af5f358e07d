"""Lead record states and the one table of allowed transitions (SPEC L4).

Why a table: a transition outside it is a bug, and a bug here is a duplicate external
write or a lost record.  The table is the single source of truth; the SQLite adapter
turns it into a trigger that refuses any other UPDATE, so even a hand-written query
cannot move a record along an edge that is not listed here.

Only two things ever make a record sendable again (ARCHITECTURE idea 9): a typed "nothing
was sent" error (``in_flight -> failed_safe``) and an operator's recorded decision after
a fresh readback (``uncertain -> failed_safe``, ``runner.tasks.resolve``).  The schema
refuses the second edge unless the decision row for that very uncertain episode exists.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class LeadState(enum.StrEnum):
    PREPARED = "prepared"
    IN_FLIGHT = "in_flight"
    CONFIRMED = "confirmed"
    FAILED_SAFE = "failed_safe"
    UNCERTAIN = "uncertain"
    CONFIRMED_THEN_MISSING = "confirmed_then_missing"


S = LeadState

#: from-state -> the states it may move to.  Nothing else is allowed.
TRANSITIONS: Mapping[LeadState, frozenset[LeadState]] = {
    # the in-flight mark (and attempts + 1) commits before the target is called
    S.PREPARED: frozenset({S.IN_FLIGHT}),
    # only BeforeWriteError -> failed_safe; anything else -> uncertain
    S.IN_FLIGHT: frozenset({S.CONFIRMED, S.FAILED_SAFE, S.UNCERTAIN}),
    # a send that certainly did not leave may be sent again
    S.FAILED_SAFE: frozenset({S.IN_FLIGHT}),
    # confirmed: an exact positive readback, or an operator's recorded decision;
    # failed_safe (sendable again): only an operator's recorded "not sent" decision after
    # a fresh readback found no row (the store refuses it without that decision row);
    # never straight back to in_flight
    S.UNCERTAIN: frozenset({S.CONFIRMED, S.FAILED_SAFE}),
    # only an explicit missing observation
    S.CONFIRMED: frozenset({S.CONFIRMED_THEN_MISSING}),
    # terminal: never recreated
    S.CONFIRMED_THEN_MISSING: frozenset(),
}

#: states the dispatcher may send, in accept order
DISPATCHABLE: frozenset[LeadState] = frozenset({S.PREPARED, S.FAILED_SAFE})


class IllegalTransition(RuntimeError):
    """A transition outside ``TRANSITIONS``: a programming error, never user input."""


def is_allowed(src: LeadState, dst: LeadState) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(src: LeadState, dst: LeadState) -> None:
    if not is_allowed(src, dst):
        raise IllegalTransition(f"illegal lead transition {src.value} -> {dst.value}")


def allowed_pairs() -> list[tuple[LeadState, LeadState]]:
    """Every allowed (from, to) pair, in a stable order (for SQL generation and tests)."""
    return [(src, dst) for src in LeadState for dst in sorted(TRANSITIONS[src])]
