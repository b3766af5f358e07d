"""Candidate lifecycle (SPEC part C): the entity, its TTL rules, its transitions and the
store operations it needs.  Pure: no I/O here; adapters live in ``runner.io``.

::

    states.py   CandidateStatus and the one table of allowed transitions
    model.py    Candidate (pydantic) and the exact return shapes of the sweeps
    rules.py    T1-T4, promotion and reconcile rules as functions of ``now``
    port.py     CandidateStore: the domain operations a Store implements
"""

from typing import TYPE_CHECKING

from runner.lazy import reexport

if TYPE_CHECKING:
    from runner.candidates.model import Candidate
    from runner.candidates.port import CandidateStore, CandidateSweeper
    from runner.candidates.results import (
        CandidateSummary,
        ExpireResult,
        ReconcileResult,
        SweepResult,
        SweepRun,
    )
    from runner.candidates.states import CandidateStatus

_WHERE = {
    "Candidate": "runner.candidates.model",
    "CandidateStatus": "runner.candidates.states",
    "CandidateStore": "runner.candidates.port",
    "CandidateSummary": "runner.candidates.results",
    "CandidateSweeper": "runner.candidates.port",
    "ExpireResult": "runner.candidates.results",
    "ReconcileResult": "runner.candidates.results",
    "SweepResult": "runner.candidates.results",
    "SweepRun": "runner.candidates.results",
}


#: names load on first use: importing the package must not build pydantic models
__getattr__ = reexport(__name__, _WHERE)

__all__ = [
    "Candidate",
    "CandidateStatus",
    "CandidateStore",
    "CandidateSummary",
    "CandidateSweeper",
    "ExpireResult",
    "ReconcileResult",
    "SweepResult",
    "SweepRun",
]
