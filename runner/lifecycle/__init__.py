"""Candidate lifecycle (SPEC part C): the entity, its TTL rules, its transitions and the
store operations it needs.  Pure: no I/O here; adapters live in ``runner.io``.

::

    states.py   CandidateStatus and the one table of allowed transitions
    model.py    Candidate (pydantic) and the exact return shapes of the sweeps
    rules.py    T1-T4, promotion and reconcile rules as functions of ``now``
    port.py     CandidateStore: the domain operations a Store implements
"""

from runner.lifecycle.model import (
    Candidate,
    CandidateSummary,
    ExpireResult,
    ReconcileResult,
    SweepResult,
    SweepRun,
)
from runner.lifecycle.port import CandidateStore, CandidateSweeper
from runner.lifecycle.states import CandidateStatus

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
