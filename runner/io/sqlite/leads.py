"""Lead queries for SQLite (SPEC L3, L13).

Accept is one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` whose outbox rows are written
by a trigger: one awaited call (and one commit) for a whole group of records, since a
multi-row INSERT is one statement; duplicates cost one more read.  SQLite applies the
VALUES rows in order, so a key that appears twice in a group is inserted once, first.
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
from runner.storedata import LeadRow, StoreSummary

if TYPE_CHECKING:
    from runner.models import LeadEvent
    from runner.storework import AcceptItem, AcceptOutcome

_INSERT = (
    "INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, updated_at)"
    " VALUES {rows} ON CONFLICT (tenant_id, source_lead_id) DO NOTHING"
)
_RETURNING = " RETURNING write_id"
#: groups up to this size learn their new keys from RETURNING; larger ones from changes()
RETURNING_ROWS = 32
_ROW = "(?, ?, ?, ?, ?, ?)"
Key = tuple[str, str]  # (tenant_id, source_lead_id)
#: rows per INSERT statement (6 parameters each, under SQLite's 32,766 limit)
CHUNK = 5000
RECORD_COLUMNS = (
    "seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts, "
    "snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL"
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
        contact_alias_present=bool(row[9]),
    )


class LeadQueries(SQLiteBase):
    # -- lead operations --------------------------------------------------------------

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        from runner.storework import AcceptItem  # the write path's data (not status's)

        return (await self.accept_many([AcceptItem(event, canonical, write_id)], now))[0]

    async def accept_many(
        self, items: Sequence[AcceptItem], now: datetime
    ) -> list[AcceptOutcome]:
        if not items:
            return []
        at = to_text(now)
        inserted: set[str] = set()
        chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        if len(chunks) == 1:  # one statement: its own transaction, one awaited call
            async with self._guard():
                inserted = await self._insert(chunks[0], at)
        else:  # _transaction() takes the connection lock itself
            async with self._transaction():
                for chunk in chunks:
                    inserted |= await self._insert(chunk, at)
        async with self._guard():
            rest = [it for it in items if it.write_id not in inserted]
            stored = await self._existing(rest) if rest else {}
        return [self._outcome(it, inserted, stored) for it in items]

    async def _insert(self, chunk: Sequence[AcceptItem], at: str) -> set[str]:
        """Insert a chunk; the write_ids that were inserted (the new keys).

        A small group reads them from ``RETURNING``.  A large one asks ``changes()``
        instead: fetching a thousand ``RETURNING`` rows takes the GIL back once per row,
        and with the next group being validated on the event loop meanwhile, each of those
        waits can last a GIL switch interval.  The write_ids are fresh, so when every row
        went in, they are all new; otherwise the few that did are looked up.
        """
        params: list[Any] = []
        for it in chunk:
            params += (it.event.tenant_id, it.event.source_lead_id, it.canonical, it.write_id,
                       at, at)
        values = ",".join([_ROW] * len(chunk))
        if len(chunk) <= RETURNING_ROWS:
            rows = await self._fetchall(_INSERT.format(rows=values) + _RETURNING, params)
            return {str(r[0]) for r in rows}
        await self._fetchall(_INSERT.format(rows=values), params)
        (count,) = (await self._fetchall("SELECT changes()"))[0]
        ids = [it.write_id for it in chunk]
        if count == len(chunk):
            return set(ids)
        marks = ",".join("?" * len(ids))
        rows = await self._fetchall(f"SELECT write_id FROM leads WHERE write_id IN ({marks})", ids)
        return {str(r[0]) for r in rows}

    async def _existing(self, items: Sequence[AcceptItem]) -> dict[Key, tuple[str, str]]:
        """The stored (canonical, write_id) of the items' keys."""
        found: dict[Key, tuple[str, str]] = {}
        keys = sorted({(it.event.tenant_id, it.event.source_lead_id) for it in items})
        for start in range(0, len(keys), 10000):
            chunk = keys[start : start + 10000]
            pairs = ",".join(["(?, ?)"] * len(chunk))
            rows = await self._fetchall(
                "SELECT tenant_id, source_lead_id, canonical, write_id FROM leads "
                f"WHERE (tenant_id, source_lead_id) IN (VALUES {pairs})",
                [part for key in chunk for part in key],
            )
            found.update({(r[0], r[1]): (r[2], r[3]) for r in rows})
        return found

    @staticmethod
    def _outcome(
        item: AcceptItem, inserted: set[str], stored: dict[Key, tuple[str, str]]
    ) -> AcceptOutcome:
        from runner.storework import AcceptOutcome

        if item.write_id in inserted:
            return AcceptOutcome("accepted", item.write_id)
        key = (item.event.tenant_id, item.event.source_lead_id)
        if key not in stored:  # records are never deleted, so this cannot happen
            raise RunnerError("accept found neither a new nor an existing record")
        canonical, write_id = stored[key]
        if canonical == item.canonical:
            return AcceptOutcome("duplicate", WriteId(write_id))
        return AcceptOutcome("conflict", WriteId(write_id))

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
