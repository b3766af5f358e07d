"""Outbox export, watermark and prune for PostgreSQL (``runner.retention``, migration v7).

As on SQLite: a prune is one transaction that locks the retention row (prunes and
watermark updates queue on it), reads its facts, records the new floor (the trigger checks
it against the same bounds), deletes (the delete trigger refuses any row above the
recorded floor) and records the prune.  A reader checks the floor after its read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runner.io.postgres.base import PostgresBase
from runner.io.storeops import RetentionOps
from runner.retention import (
    PruneFacts,
    PruneResult,
    RetentionState,
    plan_prune,
)

RETENTION_VERSION = 7
_CURSOR = "raw-retriever:outbox"
_EXPORT = """
SELECT seq, kind, subject, payload::text AS payload, at FROM {s}.outbox
WHERE seq > $1 ORDER BY seq LIMIT $2
"""
_FACTS = """
SELECT r.floor, r.export_watermark,
       coalesce((SELECT position FROM {s}.pipeline_cursors WHERE name = $1), 0) AS cursor,
       (SELECT last_seq FROM {s}.outbox_counter) AS last
FROM {s}.outbox_retention r FOR UPDATE
"""
_FIRST_UNINGESTED = """
SELECT min(o.seq) AS first FROM {s}.outbox o
WHERE o.seq > $1 AND o.seq <= $2 AND o.kind = ANY($3::text[])
  AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)
"""


class RetentionQueries(PostgresBase, RetentionOps):
    async def _floor(self) -> int:
        if self.schema_version < RETENTION_VERSION:
            return 0
        rows = await self._fetch("SELECT floor FROM {s}.outbox_retention")
        return int(rows[0]["floor"]) if rows else 0

    async def _export_rows(self, after_seq: int, limit: int) -> Sequence[Any]:
        return await self._fetch(_EXPORT, after_seq, limit)

    async def retention_state(self) -> RetentionState:
        if self.schema_version < RETENTION_VERSION:
            return RetentionState()
        async with self._guard():
            head = await self._fetch(
                "SELECT floor, export_watermark FROM {s}.outbox_retention")
            prunes = await self._fetch(
                "SELECT removed, by_kind::text AS by_kind FROM {s}.outbox_prunes")
        by_kind: dict[str, int] = {}
        for row in prunes:
            for kind, n in json.loads(row["by_kind"]).items():
                by_kind[kind] = by_kind.get(kind, 0) + int(n)
        floor = int(head[0]["floor"]) if head else 0
        watermark = head[0]["export_watermark"] if head else None
        return RetentionState(floor, None if watermark is None else int(watermark),
                              sum(int(r["removed"]) for r in prunes), by_kind)

    async def set_export_watermark(self, seq: int, at: str) -> int:
        """Record the export watermark (forward only; the trigger refuses a step back or a
        seq past the newest event).  Returns the watermark now recorded."""
        async with self._transaction():
            await self._count(
                "UPDATE {s}.outbox_retention SET export_watermark = "
                "GREATEST(coalesce(export_watermark, 0), $1), updated_at = $2", seq, at)
            rows = await self._fetch("SELECT export_watermark FROM {s}.outbox_retention")
        return int(rows[0]["export_watermark"])

    async def prune_outbox(self, before: int, kinds: Sequence[str], at: str) -> PruneResult:
        """Remove events with ``seq < before`` within every bound (``runner.retention``);
        ``kinds`` are the lead kinds the raw retriever must have ingested first."""
        async with self._transaction():
            head = (await self._fetch(_FACTS, _CURSOR))[0]
            floor, cursor = int(head["floor"]), int(head["cursor"])
            first = (await self._fetch(_FIRST_UNINGESTED, floor, cursor, list(kinds))
                     )[0]["first"] if kinds else None
            watermark = head["export_watermark"]
            facts = PruneFacts(floor, None if watermark is None else int(watermark), cursor,
                               None if first is None else int(first), int(head["last"]))
            plan = plan_prune(before, facts)
            by_kind: dict[str, int] = {}
            if plan.floor > facts.floor:
                counted = await self._fetch(
                    "SELECT kind, count(*) AS n FROM {s}.outbox WHERE seq > $1 AND seq <= $2 "
                    "GROUP BY kind ORDER BY kind", facts.floor, plan.floor)
                by_kind = {str(r["kind"]): int(r["n"]) for r in counted}
                await self._count("UPDATE {s}.outbox_retention SET floor = $1, updated_at = $2",
                                  plan.floor, at)
                await self._count("DELETE FROM {s}.outbox WHERE seq <= $1", plan.floor)
                await self._count(
                    "INSERT INTO {s}.outbox_prunes (from_floor, to_floor, removed, by_kind, "
                    "limited_by, at) VALUES ($1, $2, $3, $4::jsonb, $5, $6)",
                    facts.floor, plan.floor, sum(by_kind.values()),
                    json.dumps(by_kind, sort_keys=True), plan.limited_by, at)
        return PruneResult(sum(by_kind.values()), plan.floor, facts.floor, plan.limited_by,
                           by_kind)
