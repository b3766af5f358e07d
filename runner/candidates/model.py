"""The candidate entity and the shapes the lifecycle operations return (SPEC C1, C4).

Times are timezone-aware UTC; in JSON they are the store's fixed-width text
(``runner.clock.to_text``), so a listed ``expires_at`` compares as text exactly as the
sweep compares it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from runner.candidates.results import (  # re-exported: these are light on purpose
    DEFAULT_QUORUM,
    CandidateSummary,
    ExpireResult,
    ReconcileResult,
    SweepFunction,
    SweepResult,
    SweepRun,
)
from runner.candidates.states import CandidateStatus
from runner.clock import to_text
from runner.leads.models import Id

Quorum = Annotated[int, Field(ge=1, le=1000)]


class Candidate(BaseModel):
    """A candidate as the store holds it.  ``analysts`` are distinct, in analysis order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Id
    status: CandidateStatus = CandidateStatus.DISCOVERED
    created_at: AwareDatetime
    expires_at: AwareDatetime
    analysis_deadline: AwareDatetime
    quorum: Quorum = DEFAULT_QUORUM
    analysts: tuple[Id, ...] = ()
    promotion_locked_at: AwareDatetime | None = None
    decision_id: Id | None = None

    @model_validator(mode="after")
    def _invariants(self) -> Candidate:
        if self.analysis_deadline > self.expires_at:
            raise ValueError("analysis_deadline must be on or before expires_at (T2)")
        if len(set(self.analysts)) != len(self.analysts):
            raise ValueError("analysts must be distinct")
        return self

    @property
    def analyses(self) -> int:
        """The number of distinct analysts who analyzed this candidate."""
        return len(self.analysts)

    @property
    def has_quorum(self) -> bool:
        return self.analyses >= self.quorum

    def to_json(self) -> dict[str, Any]:
        """The JSON the CLI prints for a candidate (``candidate list`` and the others)."""
        return {
            "id": self.id,
            "status": self.status.value,
            "created_at": to_text(self.created_at),
            "expires_at": to_text(self.expires_at),
            "analysis_deadline": to_text(self.analysis_deadline),
            "quorum": self.quorum,
            "analyses": self.analyses,
            "analysts": list(self.analysts),
            "promotion_locked_at": _text_or_none(self.promotion_locked_at),
            "decision_id": self.decision_id,
        }


def _text_or_none(at: datetime | None) -> str | None:
    return None if at is None else to_text(at)



__all__ = ["DEFAULT_QUORUM", "Candidate", "CandidateSummary", "ExpireResult",
           "ReconcileResult", "SweepFunction", "SweepResult", "SweepRun"]
