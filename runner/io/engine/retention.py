"""Outbox export, watermark and prune (``runner.retention``, schema v7).

A prune is one transaction: the facts it is decided from (the floor, the export
watermark, the raw retriever's cursor and the first lead event it has not ingested, the
newest event) are read inside it (PostgreSQL locks the retention row, so prunes and
watermark updates queue on it; SQLite's ``BEGIN IMMEDIATE`` already does), the new floor
is recorded first (the schema's trigger checks it against the same bounds), then the rows
go (the delete trigger refuses any row above the recorded floor) and the prune is
recorded.

A reader checks the floor *after* reading: the floor only moves up and moves in the
transaction that deletes, so a floor still at or below ``after_seq`` after the read
proves that the read saw no deletion above ``after_seq``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runner.errors import OutboxPruned
from runner.io.engine.db import Db
from runner.retention import PruneFacts, PruneResult, RetentionState, below_floor, plan_prune

RETENTION_VERSION = 7
#: ``runner.pipeline.stages.raw_ingestion.CURSOR`` (the schemas' ``RETRIEVER_CURSOR``)
_CURSOR = "raw-retriever:outbox"


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


class RetentionOps(Db):
    schema_version: int

    async def check_outbox_floor(self, after_seq: int) -> None:
        """Raise OutboxPruned if events after ``after_seq`` were pruned (call after the
        read it vouches for)."""
        floor = 0
        if self.schema_version >= RETENTION_VERSION:
            rows = await self.fetch("outbox_floor")
            floor = int(rows[0][0]) if rows else 0
        if (why := below_floor(after_seq, floor)) is not None:
            raise OutboxPruned(why)

    async def export_outbox(self, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Events after ``after_seq`` in sequence order, at most ``limit``, whole."""
        rows = await self.fetch("export_outbox", after_seq=after_seq, limit=limit)
        await self.check_outbox_floor(after_seq)
        return [{"seq": int(r[0]), "kind": str(r[1]), "subject": r[2],
                 "payload": json.loads(r[3]), "at": str(r[4])} for r in rows]

    async def retention_state(self) -> RetentionState:
        if self.schema_version < RETENTION_VERSION:
            return RetentionState()
        head = await self.fetch("retention_head")
        prunes = await self.fetch("outbox_prunes")
        by_kind: dict[str, int] = {}
        for _, kinds in prunes:
            for kind, n in json.loads(kinds).items():
                by_kind[kind] = by_kind.get(kind, 0) + int(n)
        floor, watermark = head[0] if head else (0, None)
        return RetentionState(int(floor), _count(watermark),
                              sum(int(r[0]) for r in prunes), by_kind)

    async def set_export_watermark(self, seq: int, at: str) -> int:
        """Record the export watermark (forward only; the trigger refuses a step back or a
        seq past the newest event).  Returns the watermark now recorded."""
        async with self.transaction():
            await self.execute("advance_export_watermark", seq=seq, at=at)
            rows = await self.fetch("export_watermark")
        return int(rows[0][0])

    async def prune_outbox(self, before: int, kinds: Sequence[str], at: str) -> PruneResult:
        """Remove events with ``seq < before`` within every bound (``runner.retention``);
        ``kinds`` are the lead kinds the raw retriever must have ingested first."""
        async with self.transaction():
            floor, watermark, cursor, last = (await self.fetch("prune_facts", cursor=_CURSOR))[0]
            first = (await self.fetch("first_uningested", floor=floor, cursor=cursor,
                                      kinds=list(kinds)))[0][0] if kinds else None
            facts = PruneFacts(int(floor), _count(watermark), int(cursor), _count(first),
                               int(last))
            plan = plan_prune(before, facts)
            by_kind: dict[str, int] = {}
            if plan.floor > facts.floor:
                counted = await self.fetch("outbox_kinds_between", after_seq=facts.floor,
                                           upto=plan.floor)
                by_kind = {str(kind): int(n) for kind, n in counted}
                await self.execute("set_outbox_floor", floor=plan.floor, at=at)
                await self.execute("delete_outbox_upto", floor=plan.floor)
                await self.execute(
                    "record_prune", from_floor=facts.floor, to_floor=plan.floor,
                    removed=sum(by_kind.values()), by_kind=json.dumps(by_kind, sort_keys=True),
                    limited_by=plan.limited_by, at=at)
        return PruneResult(sum(by_kind.values()), plan.floor, facts.floor, plan.limited_by,
                           by_kind)
