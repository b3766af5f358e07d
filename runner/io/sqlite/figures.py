"""The store's figures for ``/metrics`` on SQLite (``runner.figures``), and schema v8: the
lead counts per state, kept by triggers so that no scrape counts the leads table."""

from __future__ import annotations

from runner.figures import LeadFigures
from runner.io.sqlite.base import SQLiteBase
from runner.states import LeadState


#: v8, monitoring: one row per state, counted once when the migration runs, then moved by
#: the same transaction as every insert and state change (leads are never deleted)
class FigureQueries(SQLiteBase):
    async def lead_figures(self) -> LeadFigures:
        async with self._guard():
            rows = await self._fetchall("SELECT state, n FROM lead_counts")
            oldest = await self._fetchall(
                "SELECT accepted_at FROM leads WHERE state = 'uncertain' ORDER BY seq LIMIT 1")
            failing = await self._fetchall(
                "SELECT first_at FROM poll_health WHERE recovered_at IS NULL "
                "ORDER BY run DESC LIMIT 1")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(r[0]): int(r[1]) for r in rows})
        return LeadFigures(counts, str(oldest[0][0]) if oldest else None,
                           str(failing[0][0]) if failing else None)
