"""Status observation queries for PostgreSQL (SPEC L11, L12).

A poll pass is stored in one transaction whatever its size, in two statements over arrays
(no statement per record): the changed snapshots, then the poll time of every polled
record together with the explicit missing ones.  The ``status_changed`` event is written
by a trigger that fires only when the stored snapshot really differs, and the changed
statement's ``IS DISTINCT FROM`` is re-checked by PostgreSQL against the latest row
version when another poller got there first, so two pollers racing on one change write
one event and count it once.

Poll-health runs are shared by every process of the store: a pass takes a transaction
advisory lock (keyed by the schema) before it looks at the open run, so two pollers that
fail at once open one run and write one ``poll_health`` event; a unique index keeps at
most one run open whatever the code does.
"""

from __future__ import annotations

from collections.abc import Sequence

from runner.ids import WriteId
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.connection import stable_key
from runner.io.postgres.leads import RECORD_COLUMNS, row_to_lead
from runner.io.storeops import PollOps
from runner.states import LeadState
from runner.storedata import LeadRow, ObservationWrite, PollTarget

MISSING_SNAPSHOT = '{"missing":true}'

_POLL_PAGE = """
SELECT seq, source_lead_id, write_id, snapshot FROM {s}.leads
WHERE state = 'confirmed' ORDER BY last_polled_at NULLS FIRST, seq LIMIT $1
"""
_CHANGED = """
UPDATE {s}.leads AS l SET snapshot = c.snapshot, snapshot_changed_at = $1, updated_at = $1
FROM unnest($2::text[], $3::text[]) AS c(write_id, snapshot)
WHERE l.write_id = c.write_id AND l.state = 'confirmed'
  AND l.snapshot IS DISTINCT FROM c.snapshot
RETURNING l.seq
"""
_POLLED = """
UPDATE {s}.leads SET last_polled_at = $1,
    state = CASE WHEN write_id = ANY($3::text[]) THEN 'confirmed_then_missing' ELSE state END,
    snapshot = CASE WHEN write_id = ANY($3::text[]) THEN $4 ELSE snapshot END,
    snapshot_changed_at = CASE WHEN write_id = ANY($3::text[]) THEN $1
                               ELSE snapshot_changed_at END,
    updated_at = CASE WHEN write_id = ANY($3::text[]) THEN $1 ELSE updated_at END
WHERE state = 'confirmed' AND write_id = ANY($2::text[])
"""
_OPEN_RUN = """
SELECT run, failure FROM {s}.poll_health WHERE recovered_at IS NULL
ORDER BY run DESC LIMIT 1
"""


class ObserveQueries(PostgresBase, PollOps):
    async def poll_page(self, limit: int) -> list[PollTarget]:
        async with self._guard():
            rows = await self._fetch(_POLL_PAGE, limit)
        return [PollTarget(int(r["seq"]), str(r["source_lead_id"]), WriteId(r["write_id"]),
                           r["snapshot"]) for r in rows]

    async def find_lead(self, tenant_id: str, source_lead_id: str) -> LeadRow | None:
        async with self._guard():
            rows = await self._fetch(
                f"SELECT {RECORD_COLUMNS} FROM {{s}}.leads "
                "WHERE tenant_id = $1 AND source_lead_id = $2", tenant_id, source_lead_id)
        return row_to_lead(rows[0]) if rows else None

    async def lead_snapshot(self, write_id: WriteId) -> tuple[LeadState, str | None] | None:
        async with self._guard():
            rows = await self._fetch(
                "SELECT state, snapshot FROM {s}.leads WHERE write_id = $1", write_id)
        return (LeadState(rows[0]["state"]), rows[0]["snapshot"]) if rows else None

    async def _observations(self, writes: Sequence[ObservationWrite], at: str) -> int:
        """Inside a transaction: the changed snapshots, then every polled record's poll
        time with the explicit missing ones.  Returns how many snapshots really changed."""
        changed = [w for w in writes if w.outcome == "changed"]
        missing = [w.write_id for w in writes if w.outcome == "missing"]
        really_changed = 0
        if changed:
            really_changed = len(await self._fetch(
                _CHANGED, at, [w.write_id for w in changed], [w.snapshot for w in changed]))
        await self._fetch(_POLLED, at, [w.write_id for w in writes], missing, MISSING_SNAPSHOT)
        return really_changed

    async def _clamp_poll_times(self, at: str) -> None:
        await self._fetch("UPDATE {s}.leads SET last_polled_at = $1 "
                          "WHERE state = 'confirmed' AND last_polled_at > $1", at)

    async def _poll_health(self, failure: str | None, at: str) -> bool:
        """Inside a transaction, under the store's poll-health lock (see the module)."""
        await self._fetch("SELECT pg_advisory_xact_lock($1)",
                          stable_key("runner.poll-health", self.location.schema))
        open_runs = await self._fetch(_OPEN_RUN)
        current = open_runs[0] if open_runs else None
        if current is not None and current["failure"] == failure:
            await self._fetch(
                "UPDATE {s}.poll_health SET last_at = $1, passes = passes + 1 WHERE run = $2",
                at, current["run"])
            return False
        if current is not None:
            await self._fetch("UPDATE {s}.poll_health SET recovered_at = $1 WHERE run = $2",
                              at, current["run"])
        if failure is None:
            return False
        await self._fetch(
            "INSERT INTO {s}.poll_health (failure, first_at, last_at) VALUES ($1, $2, $2)",
            failure, at)
        return True
