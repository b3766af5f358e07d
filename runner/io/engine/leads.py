"""Lead intake and the record reads (SPEC L3, L13): accept, bulk accept, the record list
and the store summary that ``status`` shows.

Accept is one statement for a new key: the record's outbox row is written by a trigger,
so the insert is its own transaction.  A key already stored costs one more read, and the
outcome (``duplicate`` or ``conflict``) is decided here from the stored canonical JSON.

A bulk accept inserts a group and learns which keys were new through the dialect's hook
``_insert_new`` (SQLite: multi-row ``VALUES`` with ``RETURNING`` or ``changes()``;
PostgreSQL: ``unnest``), then reads the stored records of the others in one statement.
The outcomes are those of accepting the items one by one in order: a key that appears
twice is inserted once, first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from runner.clock import to_text
from runner.errors import RunnerError
from runner.ids import WriteId
from runner.io.engine.db import Db, Row
from runner.leads.states import LeadState
from runner.storedata import LeadRow, ScopeData, StoreSummary

if TYPE_CHECKING:
    from runner.leads.models import LeadEvent
    from runner.retention import RetentionState
    from runner.storedata import AcceptItem, AcceptOutcome

#: how many poll-health runs and operator decisions ``status`` shows, newest first
SHOWN = 20
Key = tuple[str, str]  # (tenant_id, source_lead_id)


def lead_row(row: Row) -> LeadRow:
    """A ``record_page``/``find_lead`` row as a LeadRow."""
    return LeadRow(
        seq=int(row[0]),
        tenant_id=str(row[1]),
        source_lead_id=str(row[2]),
        write_id=WriteId(str(row[3])),
        state=LeadState(row[4]),
        attempts=int(row[5]),
        reconcile_attempts=int(row[6]),
        snapshot=json.loads(row[7]) if row[7] is not None else None,
        last_polled_at=row[8],
        contact_alias_present=bool(row[9]),
    )


def _outcome(stored_write_id: str, stored_canonical: str, canonical: str) -> AcceptOutcome:
    """An existing record's answer: the same event again, or another under its key."""
    from runner.storedata import AcceptOutcome  # the write path's data (not status's)

    same = stored_canonical == canonical
    return AcceptOutcome("duplicate" if same else "conflict", WriteId(stored_write_id))


def _never_deleted() -> RunnerError:
    return RunnerError("accept found neither a new nor an existing record")


class LeadOps(Db):
    scope_data: ScopeData | None
    schema_version: int

    if TYPE_CHECKING:
        async def _insert_new(self, items: Sequence[AcceptItem], at: str) -> set[str]:
            """Hook: insert the items (ON CONFLICT DO NOTHING, in order, a group as one
            transaction); the write_ids that went in."""
            ...

        async def retention_state(self) -> RetentionState: ...

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        from runner.storedata import AcceptOutcome

        key = {"tenant_id": event.tenant_id, "source_lead_id": event.source_lead_id}
        rows = await self.fetch("accept_lead", **key, canonical=canonical,
                                write_id=write_id, at=to_text(now))
        if not rows:  # the key was stored (on PostgreSQL: by a transaction that committed
            # while this insert waited for it, which its snapshot cannot see)
            rows = await self.fetch("accept_existing", **key)
        if not rows:  # records are never deleted, so this cannot happen
            raise _never_deleted()
        new, stored_write_id, stored_canonical = rows[0]
        if new:
            return AcceptOutcome("accepted", WriteId(str(stored_write_id)))
        return _outcome(str(stored_write_id), str(stored_canonical), canonical)

    async def accept_many(
        self, items: Sequence[AcceptItem], now: datetime
    ) -> list[AcceptOutcome]:
        from runner.storedata import AcceptOutcome

        if not items:
            return []
        inserted = await self._insert_new(items, to_text(now))
        stored: dict[Key, tuple[str, str]] = {}
        if len(inserted) < len(items):  # a new statement: it sees what others committed
            keys = dict.fromkeys((it.event.tenant_id, it.event.source_lead_id)
                                 for it in items if it.write_id not in inserted)
            rows = await self.fetch("leads_by_keys", keys=[list(key) for key in keys])
            stored = {(str(r[0]), str(r[1])): (str(r[3]), str(r[2])) for r in rows}
        outcomes: list[AcceptOutcome] = []
        for it in items:
            if it.write_id in inserted:
                outcomes.append(AcceptOutcome("accepted", it.write_id))
                continue
            found = stored.get((it.event.tenant_id, it.event.source_lead_id))
            if found is None:  # records are never deleted, so this cannot happen
                raise _never_deleted()
            outcomes.append(_outcome(*found, it.canonical))
        return outcomes

    async def iter_records(self, *, page: int = 1000) -> AsyncIterator[LeadRow]:
        after = 0
        while True:
            rows = await self.fetch("record_page", after_seq=after, limit=page)
            for row in rows:
                yield lead_row(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])

    async def summary(self) -> StoreSummary:
        (row,) = await self.fetch("store_summary", shown=SHOWN)
        retention = await self.retention_state()
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(state): int(n) for state, n in json.loads(row[0]).items()})
        by_kind = {str(kind): int(n) for kind, n in json.loads(row[1]).items()}
        pruned = None if retention.floor == 0 else {
            "floor": retention.floor, "count": retention.pruned,
            "by_kind": retention.pruned_by_kind}
        return StoreSummary(
            scope=self.scope_data,
            schema_version=self.schema_version,
            counts=counts,
            outbox_count=sum(by_kind.values()),
            outbox_last_seq=int(row[2]),
            outbox_by_kind=by_kind,
            poll_health=json.loads(row[3]),
            outbox_pruned=pruned,
            decisions=json.loads(row[4]),
        )
