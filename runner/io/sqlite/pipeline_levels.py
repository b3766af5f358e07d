"""Pipeline levels, raw ingestion, cursors and configuration for SQLite (SPEC P1, P6, P10,
P11).

Raw ingestion reads the lead outbox and writes D1 records under natural keys with
``ON CONFLICT DO NOTHING``, so re-reading a range (a lost cursor, a backfill, two
retrievers) never writes a second copy; the cursor only moves forward and only saves
re-reading.  The outbox read joins the lead's form from its canonical event (one field,
never the contact fields).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from runner.io.sqlite.base import SQLiteBase
from runner.pipeline.model import (
    FUNNEL_KEY_PREFIX,
    LevelCounts,
    Stage,
    WorkerConfigView,
    canonical,
)

if TYPE_CHECKING:  # OutboxEvent is built only by read_outbox (status never reads it)
    from runner.pipeline.work import NewRecord, OutboxEvent

_READ_OUTBOX = """
SELECT o.seq, o.kind, o.subject, o.payload, o.at, json_extract(l.canonical, '$.form_id')
FROM outbox o
LEFT JOIN leads l ON l.source_lead_id = o.subject
                 AND l.tenant_id = json_extract(o.payload, '$.tenant_id')
WHERE o.seq > ? AND o.seq <= ?
ORDER BY o.seq LIMIT ?
"""
_INGEST = """
INSERT INTO pipeline_records (level, key, payload, processor, version, updated_ms)
VALUES (1, ?, ?, ?, ?, ?)
ON CONFLICT (level, key) DO NOTHING
"""
_MOVE_CURSOR = """
INSERT INTO pipeline_cursors (name, position, updated_ms) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE
SET position = max(position, excluded.position), updated_ms = excluded.updated_ms
"""
_SAVE_CONFIG = """
INSERT INTO pipeline_worker_config (worker, desired, effective, error, updated_at)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT (worker) DO UPDATE
SET desired = excluded.desired, effective = excluded.effective, error = excluded.error,
    updated_at = excluded.updated_at
"""
_FUNNEL = f"""
SELECT json_extract(payload, '$.form_id'), json_extract(payload, '$.status'), count(*)
FROM pipeline_records
WHERE level = 4 AND key >= '{FUNNEL_KEY_PREFIX}' AND key < '{FUNNEL_KEY_PREFIX[:-1]};'
  AND json_extract(payload, '$.counted') = 1
GROUP BY 1, 2 ORDER BY 1, 2
"""
MAX_SEQ = 2**62


class PollWakeups:
    """SQLite has no notifications: a consumer simply polls."""

    async def wait(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class PipelineLevelQueries(SQLiteBase):
    if TYPE_CHECKING:  # runner.io.engine.retention.RetentionOps, composed in store.py
        async def check_outbox_floor(self, after_seq: int) -> None: ...

    async def read_outbox(self, after_seq: int, limit: int, upto_seq: int | None = None
                          ) -> list[OutboxEvent]:
        from runner.pipeline.work import OutboxEvent

        async with self._guard():
            rows = await self._fetchall(
                _READ_OUTBOX, (after_seq, MAX_SEQ if upto_seq is None else upto_seq, limit))
        await self.check_outbox_floor(after_seq)  # after the read: it vouches for it
        return [OutboxEvent(int(r[0]), str(r[1]), r[2], json.loads(r[3]), str(r[4]), r[5])
                for r in rows]

    async def ingest(self, records: Sequence[NewRecord], source: tuple[str, int],
                     cursor: str | None, position: int | None, now_ms: int) -> int:
        name, version = source
        async with self._transaction():
            new = 0
            if records:
                new = await self._executemany(_INGEST, [
                    (r.key, canonical(r.payload), name, version, now_ms) for r in records])
            if cursor is not None and position is not None:
                await self._executemany(_MOVE_CURSOR, [(cursor, position, now_ms)])
        return max(new, 0)

    async def cursor_position(self, cursor: str) -> int:
        async with self._guard():
            rows = await self._fetchall(
                "SELECT position FROM pipeline_cursors WHERE name = ?", (cursor,))
        return int(rows[0][0]) if rows else 0

    async def outbox_last_seq(self) -> int:
        async with self._guard():
            rows = await self._fetchall("SELECT coalesce(max(seq), 0) FROM outbox")
        return int(rows[0][0])

    async def outbox_pending(self, after_seq: int, kinds: Sequence[str]) -> int:
        return int(await self._outbox_pending("count(*)", after_seq, kinds) or 0)

    async def outbox_first_pending(self, after_seq: int, kinds: Sequence[str]) -> int | None:
        first = await self._outbox_pending("min(o.seq)", after_seq, kinds)
        return None if first is None else int(first)

    async def _outbox_pending(self, what: str, after_seq: int, kinds: Sequence[str]) -> Any:
        if not kinds:
            return None
        async with self._guard():
            rows = await self._fetchall(
                f"SELECT {what} FROM outbox o WHERE o.seq > ? "
                f"AND o.kind IN ({','.join('?' * len(kinds))}) "
                "AND NOT EXISTS (SELECT 1 FROM pipeline_records r "
                "WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)", (after_seq, *kinds))
        return rows[0][0]

    async def record_worker_config(self, view: WorkerConfigView) -> None:
        desired = None if view.desired is None else canonical(view.desired)
        async with self._guard():
            await self._executemany(_SAVE_CONFIG, [(
                view.worker, desired, canonical(view.effective), view.error,
                view.updated_at)])

    async def worker_configs(self) -> list[WorkerConfigView]:
        async with self._guard():
            rows = await self._fetchall(
                "SELECT worker, desired, effective, error, updated_at "
                "FROM pipeline_worker_config ORDER BY worker")
        return [WorkerConfigView(str(r[0]), None if r[1] is None else json.loads(r[1]),
                                 json.loads(r[2]), r[3], str(r[4])) for r in rows]

    async def level_counts(self) -> LevelCounts:
        async with self._guard():
            rows = await self._fetchall(
                "SELECT level, count(*) FROM pipeline_records GROUP BY level")
            history = await self._fetchall("SELECT count(*) FROM pipeline_history")
        counts = {level: 0 for level in (1, 2, 3, 4)}
        counts.update({int(r[0]): int(r[1]) for r in rows})
        return LevelCounts(counts, int(history[0][0]))

    async def funnel(self) -> dict[str, dict[str, int]]:
        async with self._guard():
            rows = await self._fetchall(_FUNNEL)
        out: dict[str, dict[str, int]] = {}
        for form, status, count in rows:
            out.setdefault(str(form), {})[str(status)] = int(count)
        return out

    async def iter_level(self, level: int
                         ) -> AsyncIterator[tuple[str, Mapping[str, Any], int]]:
        after = ""
        while True:
            async with self._guard():
                rows = await self._fetchall(
                    "SELECT key, payload, rev FROM pipeline_records "
                    "WHERE level = ? AND key > ? ORDER BY key LIMIT 1000", (level, after))
            for key, payload, rev in rows:
                yield str(key), json.loads(payload), int(rev)
            if len(rows) < 1000:
                return
            after = str(rows[-1][0])

    @asynccontextmanager
    async def wakeups(self, stage: Stage) -> AsyncIterator[PollWakeups]:
        yield PollWakeups()
