"""The exact return shapes of the lifecycle operations (SPEC C4) and what ``status`` shows.

Kept apart from the pydantic ``Candidate`` so that ``status`` never builds a model.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NamedTuple, TypedDict

from runner.candidates.states import CandidateStatus
from runner.clock import to_text

#: analyses needed before a candidate may be promoted, unless given (C1)
DEFAULT_QUORUM = 2


# -- the exact return shapes of C4 ------------------------------------------------------


class ExpireResult(TypedDict):
    """``sweepExpired`` → ``{"expired": n}``"""

    expired: int


class ReconcileResult(TypedDict):
    """``reconcileStuckPromoting`` → ``{"reconciled": n}``"""

    reconciled: int


class SweepResult(TypedDict):
    """``sweepCandidates`` → ``{"expired": n, "reconciled": m}``"""

    expired: int
    reconciled: int


SweepFunction = Literal["sweepExpired", "reconcileStuckPromoting", "sweepCandidates"]


class SweepRun(NamedTuple):
    """The last sweep a store ran: which function, at what ``now``, and what it returned."""

    function: SweepFunction
    at: datetime
    result: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "at": to_text(self.at), "result": self.result}


class CandidateSummary(NamedTuple):
    """What ``status`` shows of the lifecycle: counts per status and the last sweep."""

    counts: dict[CandidateStatus, int]
    last_sweep: SweepRun | None = None


# -- the sweep's schedule (runner.tasks.sweep runs it; status shows it) -----------------


class Workflow(NamedTuple):
    """A scheduled workflow, as the seed's ``.jsonc`` workflow file declares one."""

    name: str
    function: str
    schedule: str  # cron syntax, read in ``timezone``
    timezone: str
    interval_seconds: int
    mode: Literal["shadow"]

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


SCHEDULE = Workflow(
    name="Candidate Lifecycle Sweep",
    function="sweepCandidates",
    schedule="*/5 * * * *",
    timezone="UTC",
    interval_seconds=300,
    mode="shadow",
)
