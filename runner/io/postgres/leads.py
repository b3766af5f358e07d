"""Lead queries for PostgreSQL (SPEC L3, L13).

Accept is one statement: an ``INSERT … ON CONFLICT DO NOTHING RETURNING`` in a CTE, and
in the same statement the existing record when the key was already there; its outbox row
is written by a trigger.  One round trip per record.  Under READ COMMITTED the statement
cannot see a record that a concurrent transaction committed while the insert waited for
it, so that rare case costs one more read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.errors import RunnerError
from runner.ids import WriteId
from runner.io.postgres.base import PostgresBase
from runner.states import LeadState
from runner.storedata import AcceptItem, AcceptOutcome, LeadRow, StoreSummary

if TYPE_CHECKING:
    from runner.models import LeadEvent

_ACCEPT = """
WITH inserted AS (
    INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id,
                           accepted_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $5)
    ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
    RETURNING write_id
)
SELECT true AS new, write_id, NULL::text AS canonical FROM inserted
UNION ALL
SELECT false, write_id, canonical FROM {s}.leads
WHERE tenant_id = $1 AND source_lead_id = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
"""
_EXISTING = """
SELECT false AS new, write_id, canonical FROM {s}.leads
WHERE tenant_id = $1 AND source_lead_id = $2
"""
# a group in one statement (one transaction, one commit): the rows go in in the group's
# order, and a key that appears twice is inserted once, first (ON CONFLICT DO NOTHING
# also skips a row that conflicts with one the same statement inserted)
_INSERT_MANY = """
INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id, accepted_at,
                       updated_at)
SELECT tenant_id, source_lead_id, canonical, write_id, $5, $5
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY
     AS item(tenant_id, source_lead_id, canonical, write_id, n)
ORDER BY n
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING write_id
"""
_EXISTING_MANY = """
SELECT l.tenant_id, l.source_lead_id, l.canonical, l.write_id
FROM {s}.leads l
JOIN unnest($1::text[], $2::text[]) AS k(tenant_id, source_lead_id)
  ON l.tenant_id = k.tenant_id AND l.source_lead_id = k.source_lead_id
"""
_SUMMARY = """
SELECT
  (SELECT coalesce(json_object_agg(state, n ORDER BY state), '{}')::text
   FROM (SELECT state, count(*) AS n FROM {s}.leads GROUP BY state) AS by_state) AS states,
  (SELECT coalesce(json_object_agg(kind, n ORDER BY kind), '{}')::text
   FROM (SELECT kind, count(*) AS n FROM {s}.outbox GROUP BY kind) AS by_kind) AS kinds,
  (SELECT coalesce(max(seq), 0) FROM {s}.outbox) AS last_seq,
  (SELECT coalesce(json_agg(runs ORDER BY runs.run DESC), '[]')::text
   FROM (SELECT run, failure, first_at AS since, last_at, passes, recovered_at,
                recovered_at IS NULL AS open
         FROM {s}.poll_health ORDER BY run DESC LIMIT 20) AS runs) AS poll_health,
  (SELECT coalesce(json_agg(d ORDER BY d.id DESC), '[]')::text
   FROM (SELECT id, source_lead_id, write_id, decision, reason, readback, attempts,
                decided_at AS at
         FROM {s}.operator_decisions ORDER BY id DESC LIMIT 20) AS d) AS decisions
"""
RECORD_COLUMNS = (
    "seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts, "
    "snapshot, last_polled_at, (canonical::jsonb ? 'contact_alias') AS contact_alias_present"
)
_RECORD_PAGE = f"SELECT {RECORD_COLUMNS} FROM {{s}}.leads WHERE seq > $1 ORDER BY seq LIMIT $2"


def row_to_lead(row: Any) -> LeadRow:
    return LeadRow(
        seq=int(row["seq"]),
        tenant_id=str(row["tenant_id"]),
        source_lead_id=str(row["source_lead_id"]),
        write_id=WriteId(str(row["write_id"])),
        state=LeadState(row["state"]),
        attempts=int(row["attempts"]),
        reconcile_attempts=int(row["reconcile_attempts"]),
        snapshot=json.loads(row["snapshot"]) if row["snapshot"] is not None else None,
        last_polled_at=row["last_polled_at"],
        contact_alias_present=bool(row["contact_alias_present"]),
    )


def _outcome(
    item: AcceptItem, inserted: set[str], stored: dict[tuple[str, str], tuple[str, str]]
) -> AcceptOutcome:
    if item.write_id in inserted:
        return AcceptOutcome("accepted", item.write_id)
    key = (item.event.tenant_id, item.event.source_lead_id)
    if key not in stored:  # records are never deleted, so this cannot happen
        raise RunnerError("accept found neither a new nor an existing record")
    canonical, write_id = stored[key]
    if canonical == item.canonical:
        return AcceptOutcome("duplicate", WriteId(write_id))
    return AcceptOutcome("conflict", WriteId(write_id))


class LeadQueries(PostgresBase):
    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        key = (event.tenant_id, event.source_lead_id)
        async with self._guard():
            rows = await self._fetch(_ACCEPT, *key, canonical, write_id, to_text(now))
            if not rows:  # committed by another transaction while our insert waited
                rows = await self._fetch(_EXISTING, *key)
        if not rows:  # records are never deleted, so this cannot happen
            raise RunnerError("accept found neither a new nor an existing record")
        row = rows[0]
        if row["new"]:
            return AcceptOutcome("accepted", WriteId(row["write_id"]))
        if row["canonical"] == canonical:
            return AcceptOutcome("duplicate", WriteId(row["write_id"]))
        return AcceptOutcome("conflict", WriteId(row["write_id"]))

    async def accept_many(
        self, items: Sequence[AcceptItem], now: datetime
    ) -> list[AcceptOutcome]:
        if not items:
            return []
        events = [it.event for it in items]
        async with self._guard():
            rows = await self._fetch(
                _INSERT_MANY, [e.tenant_id for e in events], [e.source_lead_id for e in events],
                [it.canonical for it in items], [it.write_id for it in items], to_text(now))
            inserted = {str(r["write_id"]) for r in rows}
            rest = [it for it in items if it.write_id not in inserted]
            stored: dict[tuple[str, str], tuple[str, str]] = {}
            if rest:  # a new statement: it sees what this one and others committed
                found = await self._fetch(
                    _EXISTING_MANY, [it.event.tenant_id for it in rest],
                    [it.event.source_lead_id for it in rest])
                stored = {(r["tenant_id"], r["source_lead_id"]): (r["canonical"], r["write_id"])
                          for r in found}
        return [_outcome(it, inserted, stored) for it in items]

    async def summary(self) -> StoreSummary:
        async with self._guard():
            (row,) = await self._fetch(_SUMMARY)
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(state): int(n) for state, n in json.loads(row["states"]).items()})
        by_kind = {str(kind): int(n) for kind, n in json.loads(row["kinds"]).items()}
        return StoreSummary(
            scope=self.scope_data,
            schema_version=self.schema_version,
            counts=counts,
            outbox_count=sum(by_kind.values()),
            outbox_last_seq=int(row["last_seq"]),
            outbox_by_kind=by_kind,
            poll_health=json.loads(row["poll_health"]),
            decisions=json.loads(row["decisions"]),
        )

    async def iter_records(self, *, page: int = 1000) -> AsyncIterator[LeadRow]:
        after = 0
        while True:
            async with self._guard():
                rows = await self._fetch(_RECORD_PAGE, after, page)
            for row in rows:
                yield row_to_lead(row)
            if len(rows) < page:
                return
            after = int(rows[-1]["seq"])
