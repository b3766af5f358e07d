"""Status observation queries for SQLite (SPEC L11, L12).

A poll pass is stored in one transaction whatever its size: one UPDATE moves every polled
record's poll time, and only changed snapshots and missing rows are written one by one.
The ``status_changed`` event is written by a trigger that fires only when the stored
snapshot really differs, so an unchanged poll cannot write an event, and two pollers
racing on the same change write it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner.ids import WriteId
from runner.io.sqlite.base import SQLiteBase
from runner.io.sqlite.leads import RECORD_COLUMNS, row_to_lead
from runner.io.storeops import PollOps
from runner.states import LeadState
from runner.storedata import LeadRow

if TYPE_CHECKING:
    from runner.storework import ObservationWrite, PollTarget

MISSING_SNAPSHOT = '{"missing":true}'
#: how many poll-health runs ``status`` shows, newest first
HEALTH_SHOWN = 20


class ObserveQueries(SQLiteBase, PollOps):
    async def poll_page(self, limit: int) -> list[PollTarget]:
        from runner.storework import PollTarget  # the poller's data (not status's)

        async with self._guard():
            rows = await self._fetchall(
                "SELECT seq, source_lead_id, write_id, snapshot FROM leads "
                "WHERE state = 'confirmed' ORDER BY last_polled_at, seq LIMIT ?",  # NULLs first
                (limit,),
            )
        return [PollTarget(int(r[0]), str(r[1]), WriteId(str(r[2])), r[3]) for r in rows]

    async def find_lead(self, tenant_id: str, source_lead_id: str) -> LeadRow | None:
        async with self._guard():
            rows = await self._fetchall(
                f"SELECT {RECORD_COLUMNS} FROM leads WHERE tenant_id = ? AND source_lead_id = ?",
                (tenant_id, source_lead_id),
            )
        return row_to_lead(rows[0]) if rows else None

    async def lead_snapshot(self, write_id: WriteId) -> tuple[LeadState, str | None] | None:
        async with self._guard():
            rows = await self._fetchall(
                "SELECT state, snapshot FROM leads WHERE write_id = ?", (write_id,))
        return (LeadState(rows[0][0]), rows[0][1]) if rows else None

    async def _observations(self, writes: Sequence[ObservationWrite], at: str) -> int:
        changed = [(w.snapshot, at, at, w.write_id, w.snapshot)
                   for w in writes if w.outcome == "changed"]
        missing = [(MISSING_SNAPSHOT, at, at, w.write_id) for w in writes if w.outcome == "missing"]
        ids = [w.write_id for w in writes]
        really_changed = 0
        for start in range(0, len(ids), 5000):
            chunk = ids[start : start + 5000]
            await self._fetchall(
                f"UPDATE leads SET last_polled_at = ? WHERE state = 'confirmed' "
                f"AND write_id IN ({','.join('?' * len(chunk))})",
                (at, *chunk),
            )
        if changed:
            really_changed = max(await self._executemany(
                "UPDATE leads SET snapshot = ?, snapshot_changed_at = ?, updated_at = ? "
                "WHERE write_id = ? AND state = 'confirmed' AND snapshot IS NOT ?",
                changed,
            ), 0)
        if missing:
            await self._executemany(
                "UPDATE leads SET state = 'confirmed_then_missing', snapshot = ?, "
                "snapshot_changed_at = ?, updated_at = ? "
                "WHERE write_id = ? AND state = 'confirmed'",
                missing,
            )
        return really_changed

    async def _clamp_poll_times(self, at: str) -> None:
        await self._fetchall("UPDATE leads SET last_polled_at = ? "
                             "WHERE state = 'confirmed' AND last_polled_at > ?", (at, at))

    async def _poll_health(self, failure: str | None, at: str) -> bool:
        open_runs = await self._fetchall(
            "SELECT run, failure FROM poll_health WHERE recovered_at IS NULL "
            "ORDER BY run DESC LIMIT 1")
        current = open_runs[0] if open_runs else None
        if current is not None and current[1] == failure:
            await self._fetchall(
                "UPDATE poll_health SET last_at = ?, passes = passes + 1 WHERE run = ?",
                (at, current[0]))
            return False
        if current is not None:
            await self._fetchall(
                "UPDATE poll_health SET recovered_at = ? WHERE run = ?", (at, current[0]))
        if failure is None:
            return False
        await self._fetchall(
            "INSERT INTO poll_health (failure, first_at, last_at) VALUES (?, ?, ?)",
            (failure, at, at))
        return True

    async def poll_health_runs(self) -> list[dict[str, Any]]:
        async with self._guard():
            rows = await self._fetchall(
                "SELECT run, failure, first_at, last_at, passes, recovered_at FROM poll_health "
                "ORDER BY run DESC LIMIT ?", (HEALTH_SHOWN,))
        return [
            {"run": r[0], "failure": r[1], "since": r[2], "last_at": r[3], "passes": r[4],
             "recovered_at": r[5], "open": r[5] is None}
            for r in rows
        ]
