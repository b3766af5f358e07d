"""Lead queries for SQLite (SPEC L3, L13).

Accept is one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` whose outbox row is written by
a trigger: one awaited call per new record (a duplicate costs one more read).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.errors import RunnerError
from runner.ids import WriteId
from runner.io.sqlite.base import SQLiteBase
from runner.states import LeadState
from runner.store import AcceptOutcome, LeadRow, StoreSummary

if TYPE_CHECKING:
    from runner.models import LeadEvent

_ACCEPT = """
INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, state,
                   accepted_at, updated_at)
VALUES (?, ?, ?, ?, 'prepared', ?, ?)
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING write_id
"""
_EXISTING = "SELECT canonical, write_id FROM leads WHERE tenant_id = ? AND source_lead_id = ?"
RECORD_COLUMNS = (
    "seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts, "
    "snapshot, last_polled_at"
)
_RECORD_PAGE = f"SELECT {RECORD_COLUMNS} FROM leads WHERE seq > ? ORDER BY seq LIMIT ?"


def row_to_lead(row: Sequence[Any]) -> LeadRow:
    snapshot = json.loads(row[7]) if row[7] is not None else None
    return LeadRow(
        seq=int(row[0]),
        tenant_id=str(row[1]),
        source_lead_id=str(row[2]),
        write_id=WriteId(str(row[3])),
        state=LeadState(row[4]),
        attempts=int(row[5]),
        reconcile_attempts=int(row[6]),
        snapshot=snapshot,
        last_polled_at=row[8],
    )


class LeadQueries(SQLiteBase):
    # -- lead operations --------------------------------------------------------------

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        at = to_text(now)
        key = (event.tenant_id, event.source_lead_id)
        async with self._guard():
            inserted = await self._fetchall(_ACCEPT, (*key, canonical, write_id, at, at))
            if inserted:
                return AcceptOutcome("accepted", WriteId(inserted[0][0]))
            existing = await self._fetchall(_EXISTING, key)
        if not existing:  # records are never deleted, so this cannot happen
            raise RunnerError("accept found neither a new nor an existing record")
        stored, stored_write_id = existing[0]
        if stored == canonical:
            return AcceptOutcome("duplicate", WriteId(stored_write_id))
        return AcceptOutcome("conflict", WriteId(stored_write_id))

    async def summary(self) -> StoreSummary:
        async with self._guard():
            states = await self._fetchall("SELECT state, count(*) FROM leads GROUP BY state")
            kinds = await self._fetchall("SELECT kind, count(*) FROM outbox GROUP BY kind")
            last = await self._fetchall("SELECT coalesce(max(seq), 0) FROM outbox")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(state): int(n) for state, n in states})
        by_kind = {str(kind): int(n) for kind, n in kinds}
        return StoreSummary(
            scope=self.scope_data,
            schema_version=self.schema_version,
            counts=counts,
            outbox_count=sum(by_kind.values()),
            outbox_last_seq=int(last[0][0]),
            outbox_by_kind=by_kind,
        )

    async def iter_records(self, *, page: int = 1000) -> AsyncIterator[LeadRow]:
        after = 0
        while True:
            async with self._guard():
                rows = await self._fetchall(_RECORD_PAGE, (after, page))
            for row in rows:
                yield row_to_lead(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])
