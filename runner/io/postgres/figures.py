"""The store's figures for ``/metrics`` on PostgreSQL (``runner.figures``), and schema v8
(as on SQLite): the lead counts per state, kept by triggers.

An insert statement adds its rows per state once (a statement trigger over its
transition table), so a group commit of a thousand records updates each count once.  The
counter rows are hot, like ``outbox_counter``, which every write already takes, so they add
no new point where writers queue.
"""

from __future__ import annotations

from runner.figures import LeadFigures
from runner.io.postgres.base import PostgresBase
from runner.states import LeadState


class FigureQueries(PostgresBase):
    async def lead_figures(self) -> LeadFigures:
        async with self._guard():
            rows = await self._fetch("SELECT state, n FROM {s}.lead_counts")
            oldest = await self._fetch(
                "SELECT accepted_at FROM {s}.leads WHERE state = 'uncertain' "
                "ORDER BY seq LIMIT 1")
            failing = await self._fetch(
                "SELECT first_at FROM {s}.poll_health WHERE recovered_at IS NULL "
                "ORDER BY run DESC LIMIT 1")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(r["state"]): int(r["n"]) for r in rows})
        return LeadFigures(counts, str(oldest[0]["accepted_at"]) if oldest else None,
                           str(failing[0]["first_at"]) if failing else None)
