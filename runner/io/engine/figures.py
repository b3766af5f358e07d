"""The store's figures for ``/metrics`` (``runner.figures``): the lead counts per state
that schema v8 keeps by trigger (no scrape counts the leads table), the oldest uncertain
record and the open poll-failure run."""

from __future__ import annotations

from runner.figures import LeadFigures
from runner.io.engine.db import Db
from runner.leads.states import LeadState


class FigureOps(Db):
    async def lead_figures(self) -> LeadFigures:
        async with self.reading():
            rows = await self.fetch("lead_counts")
            oldest = await self.fetch("oldest_uncertain_accepted_at")
            failing = await self.fetch("open_poll_failure_since")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(r[0]): int(r[1]) for r in rows})
        return LeadFigures(counts, str(oldest[0][0]) if oldest else None,
                           str(failing[0][0]) if failing else None)
