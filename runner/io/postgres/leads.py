"""Lead queries for PostgreSQL (SPEC L3, L13).

Accept is one statement: an ``INSERT … ON CONFLICT DO NOTHING RETURNING`` in a CTE, and
in the same statement the existing record when the key was already there; its outbox row
is written by a trigger.  One round trip per record.  Under READ COMMITTED the statement
cannot see a record that a concurrent transaction committed while the insert waited for
it, so that rare case costs one more read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.errors import RunnerError
from runner.ids import WriteId
from runner.io.postgres.base import PostgresBase
from runner.states import LeadState
from runner.store import AcceptOutcome, LeadRow, StoreSummary

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
         FROM {s}.poll_health ORDER BY run DESC LIMIT 20) AS runs) AS poll_health
"""
RECORD_COLUMNS = (
    "seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts, "
    "snapshot, last_polled_at"
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
    )


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
