"""Outbox export, watermark and prune for SQLite (``runner.retention``, migration v7).

A prune is one ``BEGIN IMMEDIATE`` transaction: the facts it is decided from (the floor,
the export watermark, the raw retriever's cursor and the first lead event it has not
ingested, the newest event) are read inside it, the new floor is recorded first (the
schema's trigger checks it against the same bounds), then the rows go (the delete trigger
refuses any row above the recorded floor) and the prune is recorded.

A reader checks the floor *after* reading: the floor only moves up and moves in the
transaction that deletes, so a floor still at or below ``after_seq`` after the read proves
that the read saw no deletion above ``after_seq``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runner.io.sqlite.base import SQLiteBase
from runner.io.storeops import RetentionOps
from runner.retention import (
    PruneFacts,
    PruneResult,
    RetentionState,
    plan_prune,
)

RETENTION_VERSION = 7
_CURSOR = "raw-retriever:outbox"
_EXPORT = "SELECT seq, kind, subject, payload, at FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?"


class RetentionQueries(SQLiteBase, RetentionOps):
    async def _floor(self) -> int:
        if self.schema_version < RETENTION_VERSION:
            return 0
        rows = await self._fetchall("SELECT floor FROM outbox_retention")
        return int(rows[0][0]) if rows else 0

    async def _export_rows(self, after_seq: int, limit: int) -> Sequence[Any]:
        return await self._fetchall(_EXPORT, (after_seq, limit))

    async def retention_state(self) -> RetentionState:
        if self.schema_version < RETENTION_VERSION:
            return RetentionState()
        async with self._guard():
            head = await self._fetchall(
                "SELECT floor, export_watermark FROM outbox_retention")
            prunes = await self._fetchall("SELECT removed, by_kind FROM outbox_prunes")
        by_kind: dict[str, int] = {}
        for _, kinds in prunes:
            for kind, n in json.loads(kinds).items():
                by_kind[kind] = by_kind.get(kind, 0) + int(n)
        floor, watermark = head[0] if head else (0, None)
        return RetentionState(int(floor), None if watermark is None else int(watermark),
                              sum(int(r[0]) for r in prunes), by_kind)

    async def set_export_watermark(self, seq: int, at: str) -> int:
        """Record the export watermark (forward only; the trigger refuses a step back or a
        seq past the newest event).  Returns the watermark now recorded."""
        async with self._transaction():
            await self._executemany(
                "UPDATE outbox_retention SET export_watermark = "
                "max(coalesce(export_watermark, 0), ?), updated_at = ?", [(seq, at)])
            rows = await self._fetchall("SELECT export_watermark FROM outbox_retention")
        return int(rows[0][0])

    async def prune_outbox(self, before: int, kinds: Sequence[str], at: str) -> PruneResult:
        """Remove events with ``seq < before`` within every bound (``runner.retention``);
        ``kinds`` are the lead kinds the raw retriever must have ingested first."""
        marks = ",".join("?" * len(kinds))
        async with self._transaction():
            head = await self._fetchall(
                "SELECT r.floor, r.export_watermark, "
                "coalesce((SELECT position FROM pipeline_cursors WHERE name = ?), 0), "
                "(SELECT coalesce(max(seq), 0) FROM outbox) FROM outbox_retention r",
                (_CURSOR,))
            floor, watermark, cursor, last = head[0]
            first = await self._fetchall(
                f"SELECT min(o.seq) FROM outbox o WHERE o.seq > ? AND o.seq <= ? "
                f"AND o.kind IN ({marks}) AND NOT EXISTS (SELECT 1 FROM pipeline_records r "
                "WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)",
                (floor, cursor, *kinds)) if kinds else [(None,)]
            facts = PruneFacts(int(floor), None if watermark is None else int(watermark),
                               int(cursor), None if first[0][0] is None else int(first[0][0]),
                               int(last))
            plan = plan_prune(before, facts)
            by_kind: dict[str, int] = {}
            if plan.floor > facts.floor:
                counted = await self._fetchall(
                    "SELECT kind, count(*) FROM outbox WHERE seq > ? AND seq <= ? "
                    "GROUP BY kind ORDER BY kind", (facts.floor, plan.floor))
                by_kind = {str(k): int(n) for k, n in counted}
                await self._executemany(
                    "UPDATE outbox_retention SET floor = ?, updated_at = ?",
                    [(plan.floor, at)])
                await self._executemany("DELETE FROM outbox WHERE seq <= ?", [(plan.floor,)])
                await self._executemany(
                    "INSERT INTO outbox_prunes (from_floor, to_floor, removed, by_kind, "
                    "limited_by, at) VALUES (?, ?, ?, ?, ?, ?)",
                    [(facts.floor, plan.floor, sum(by_kind.values()),
                      json.dumps(by_kind, sort_keys=True), plan.limited_by, at)])
        return PruneResult(sum(by_kind.values()), plan.floor, facts.floor, plan.limited_by,
                           by_kind)
