"""The store's figures for monitoring (SPEC E4), and the narrow port that reads them.

``/metrics`` reads these at every scrape, so each must cost the same on a store of a
thousand leads and of a million:

* leads by state come from ``lead_counts``, one row per state kept by triggers in the
  transaction of every insert and state change (schema v8) — never a ``count(*)`` of the
  leads table, which takes a third of a second per million rows;
* the oldest uncertain record is the first of the ``(state, seq)`` index, one row read;
* the outbox's last sequence number is the top of its primary key;
* the open poll-health run is the newest row of a small table;
* the candidate counts, the last sweep and the processors' backlog are the queries
  ``status`` makes (the backlog is counted per processor version, on its queue);
* raw ingestion's backlog is reported as its lag, the outbox events after the raw
  retriever's cursor (an upper bound: not every event kind is tailed), because counting
  the tailed kinds exactly reads every outbox event after the cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from runner.leads.states import LeadState

if TYPE_CHECKING:
    from runner.candidates.results import CandidateSummary
    from runner.pipeline.model import ProcessorRef


class LeadFigures(NamedTuple):
    """The lead figures ``/metrics`` and the alerts read (one small read each)."""

    counts: dict[LeadState, int]
    #: when the oldest (first accepted) uncertain record was accepted, or None
    oldest_uncertain_accepted_at: str | None
    #: when the open poll-health run (status reads failing) began, or None when healthy
    poll_failing_since: str | None = None


class FiguresStore(Protocol):
    """What ``/metrics`` reads (every method one small read)."""

    async def lead_figures(self) -> LeadFigures: ...

    async def outbox_last_seq(self) -> int: ...

    async def candidate_summary(self) -> CandidateSummary: ...

    async def registered_processors(self) -> list[ProcessorRef]: ...

    async def backlog(self, refs: Sequence[ProcessorRef]) -> dict[str, int]: ...

    async def cursor_position(self, cursor: str) -> int: ...
