"""Candidate statuses and the one table of allowed transitions (SPEC C1, C3, C4).

Like ``runner.leads.states`` for leads: the table is the single source of truth, and the SQLite
adapter turns it into a trigger, so no query can move a candidate along an edge that is
not listed here.  Promoted, rejected and expired are terminal: nothing leaves them (T5,
T6), and the schema also refuses any change to a terminal row.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class CandidateStatus(enum.StrEnum):
    DISCOVERED = "discovered"
    ANALYZING = "analyzing"
    PROMOTING = "promoting"
    PROMOTED = "promoted"
    REJECTED = "rejected"
    EXPIRED = "expired"


C = CandidateStatus

#: from-status -> the statuses it may move to.  Nothing else is allowed.
TRANSITIONS: Mapping[CandidateStatus, frozenset[CandidateStatus]] = {
    # the first analysis starts the analysis; T3/T4 expire an idle candidate
    C.DISCOVERED: frozenset({C.ANALYZING, C.EXPIRED}),
    # with quorum and unexpired: the promotion lock; otherwise T3/T4
    C.ANALYZING: frozenset({C.PROMOTING, C.EXPIRED}),
    # the recorded decision decides: present -> promoted, absent (stuck) -> rejected
    C.PROMOTING: frozenset({C.PROMOTED, C.REJECTED}),
    # terminal, immutable, never deleted (T5, T6)
    C.PROMOTED: frozenset(),
    C.REJECTED: frozenset(),
    C.EXPIRED: frozenset(),
}

#: statuses the expiry sweep looks at (T3, T4); promoting is past the expiry gate
ACTIVE: frozenset[CandidateStatus] = frozenset({C.DISCOVERED, C.ANALYZING})
TERMINAL: frozenset[CandidateStatus] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


class IllegalCandidateTransition(RuntimeError):
    """A transition outside ``TRANSITIONS``: a programming error, never user input."""


def is_allowed(src: CandidateStatus, dst: CandidateStatus) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(src: CandidateStatus, dst: CandidateStatus) -> None:
    if not is_allowed(src, dst):
        raise IllegalCandidateTransition(
            f"illegal candidate transition {src.value} -> {dst.value}"
        )


def allowed_pairs() -> list[tuple[CandidateStatus, CandidateStatus]]:
    """Every allowed (from, to) pair, in a stable order (for SQL generation and tests)."""
    return [(src, dst) for src in CandidateStatus for dst in sorted(TRANSITIONS[src])]
