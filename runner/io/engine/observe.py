"""Status observations (SPEC L11, L12): the poll page, a record's snapshot, and a poll
pass's writes, stored in one transaction whatever its size.

Statements over lists (none per record): the changed snapshots, every polled record's
poll time, and (when there are any) the missing ones' move.  The ``status_changed`` event is
written by a trigger that fires only when the stored snapshot really differs, so an
unchanged poll writes no event, and two pollers racing on one change write it once.

Poll-health runs are shared by every process of the store: a pass takes the dialect's
poll-health lock (``_lock_poll_health``; SQLite's ``BEGIN IMMEDIATE`` already is one)
before it looks at the open run, so two pollers that fail at once open one run and write
one ``poll_health`` event.

Writes whose count is not needed go through ``fetch``: on SQLite that is one hop to the
connection's thread, where ``execute``'s row count costs a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from runner.clock import to_text
from runner.ids import WriteId
from runner.io.engine.db import Db
from runner.io.engine.leads import lead_row
from runner.leads.states import LeadState
from runner.storedata import LeadRow

if TYPE_CHECKING:
    from runner.storedata import ObservationWrite, PollTarget

MISSING_SNAPSHOT = '{"missing":true}'


class PollOps(Db):
    if TYPE_CHECKING:
        async def _lock_poll_health(self) -> None:
            """Hook, inside the pass's transaction: keep other processes' passes out of
            the poll-health runs until it commits."""
            ...

    async def poll_page(self, limit: int) -> list[PollTarget]:
        from runner.storedata import PollTarget  # the poller's data (not status's)

        rows = await self.fetch("poll_page", limit=limit)
        return [PollTarget(int(r[0]), str(r[1]), WriteId(str(r[2])), r[3]) for r in rows]

    async def find_lead(self, tenant_id: str, source_lead_id: str) -> LeadRow | None:
        rows = await self.fetch("find_lead", tenant_id=tenant_id, source_lead_id=source_lead_id)
        return lead_row(rows[0]) if rows else None

    async def lead_snapshot(self, write_id: WriteId) -> tuple[LeadState, str | None] | None:
        rows = await self.fetch("lead_snapshot", write_id=write_id)
        return (LeadState(rows[0][0]), rows[0][1]) if rows else None

    async def apply_observations(self, writes: Sequence[ObservationWrite], now: datetime) -> int:
        if not writes:
            return 0
        async with self.transaction():
            return await self._observations(writes, to_text(now))

    async def record_poll_pass(
        self, writes: Sequence[ObservationWrite], failure: str | None, now: datetime
    ) -> tuple[int, bool]:
        at = to_text(now)
        async with self.transaction():
            # time that went backwards: a poll time after ``now`` counts as ``now``, so
            # the records polled "in the future" take their turn again (oldest poll first)
            await self.fetch("clamp_poll_times", at=at)
            changed = await self._observations(writes, at) if writes else 0
            return changed, await self._poll_health(failure, at)

    async def _observations(self, writes: Sequence[ObservationWrite], at: str) -> int:
        """Inside a transaction; returns how many snapshots really changed."""
        changes = [[w.write_id, w.snapshot] for w in writes if w.outcome == "changed"]
        changed = len(await self.fetch("observe_changed", at=at, changes=changes)) if changes else 0
        await self.fetch("observe_polled", at=at, write_ids=[w.write_id for w in writes])
        if missing := [w.write_id for w in writes if w.outcome == "missing"]:
            await self.fetch("observe_missing", at=at, write_ids=missing,
                             missing_snapshot=MISSING_SNAPSHOT)
        return changed

    async def _poll_health(self, failure: str | None, at: str) -> bool:
        """Inside a transaction: extend the open run if it is the same failure, else close
        it and (for a failure) open a new one, whose trigger writes the event."""
        await self._lock_poll_health()
        open_runs = await self.fetch("open_poll_run")
        current = open_runs[0] if open_runs else None
        if current is not None and current[1] == failure:
            await self.fetch("extend_poll_run", at=at, run=current[0])
            return False
        if current is not None:
            await self.fetch("close_poll_run", at=at, run=current[0])
        if failure is None:
            return False
        await self.fetch("start_poll_run", failure=failure, at=at)
        return True
