"""The data the write paths exchange with the store: accepting events (``AcceptItem``,
``AcceptOutcome``), the delivery cycle (``LeadWork``) and status polls (``PollTarget``,
``ObservationWrite``).

Split from ``runner.storedata`` (which re-exports these names, loaded on first use) so
that reading the store for ``status`` never builds these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from runner.ids import WriteId
from runner.leads.states import LeadState
from runner.storedata import AcceptResultKind, ObservationOutcome

if TYPE_CHECKING:
    from runner.leads.models import LeadEvent


@dataclass(frozen=True)
class AcceptOutcome:
    result: AcceptResultKind
    write_id: WriteId


@dataclass(frozen=True)
class AcceptItem:
    """One validated event to accept, with its canonical JSON and a fresh write_id (used
    only if the key is new)."""

    event: LeadEvent
    canonical: str
    write_id: WriteId


@dataclass(frozen=True)
class LeadWork:
    """A record the cycle works on: its key, write_id, state and validated event."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    state: LeadState
    event: LeadEvent


@dataclass(frozen=True)
class ResolveSubject:
    """A record an operator names by write_id: its work (key, state, event) and its
    ``attempts`` (a decision is bound to the uncertain episode at that count)."""

    work: LeadWork
    tenant_id: str
    attempts: int


@dataclass(frozen=True)
class Decision:
    """An operator's recorded decision on an uncertain record (``runner resolve``).

    ``decision``: ``confirmed`` (the operator verified the row by other means) or
    ``not_sent`` (a fresh readback found no row: the record becomes sendable again,
    ``failed_safe``).  ``readback``: that readback's verdict, None when none was made.
    """

    tenant_id: str
    source_lead_id: str
    write_id: WriteId
    decision: Literal["confirmed", "not_sent"]
    reason: str
    readback: str | None
    attempts: int

    @property
    def to_state(self) -> LeadState:
        return LeadState.CONFIRMED if self.decision == "confirmed" else LeadState.FAILED_SAFE


@dataclass(frozen=True)
class PollTarget:
    """A confirmed record due for a status poll, with its last snapshot (canonical JSON)."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    snapshot: str | None


@dataclass(frozen=True)
class ObservationWrite:
    """What to store for one observation (L11): ``changed`` stores ``snapshot`` (canonical
    JSON) and writes a ``status_changed`` event; ``unchanged`` and ``failed`` only move the
    poll time; ``missing`` makes the record ``confirmed_then_missing``."""

    write_id: WriteId
    outcome: ObservationOutcome
    snapshot: str | None = None
