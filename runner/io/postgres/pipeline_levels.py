"""Pipeline levels, raw ingestion, cursors, configuration and wake-ups for PostgreSQL
(SPEC P1, P6, P9, P10, P11).

Raw ingestion writes D1 records under natural keys with ``ON CONFLICT DO NOTHING``; the
outbox is tailed by its gap-free, commit-ordered sequence, so a reader never skips an
event that commits late.

Wake-ups: a consumer listens on a session of its own (``LISTEN runner_pipeline``) and is
woken when its stage gets new input (see ``pipeline_schema``).  The listener is only a
hint: every consumer also polls, so a notification lost to a dropped session, a restart
or a writer with notifications off delays work by at most one poll interval and loses
nothing.  A dead listener session is noticed (its termination callback, or a failed
health check when a wait times out) and replaced at the next wait; until then the
consumer simply polls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

from runner.io.postgres import connection
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.dsn import PgLocation
from runner.io.postgres.pipeline_schema import CHANNEL
from runner.pipeline.model import (
    FUNNEL_KEY_PREFIX,
    LevelCounts,
    NewRecord,
    OutboxEvent,
    Stage,
    WorkerConfigView,
    canonical,
)

log = logging.getLogger("runner.pipeline")

_READ_OUTBOX = """
SELECT o.seq, o.kind, o.subject, o.payload::text AS payload, o.at,
       (l.canonical::jsonb) ->> 'form_id' AS form_id
FROM {s}.outbox o
LEFT JOIN {s}.leads l ON l.source_lead_id = o.subject
                     AND l.tenant_id = o.payload ->> 'tenant_id'
WHERE o.seq > $1 AND o.seq <= $2
ORDER BY o.seq LIMIT $3
"""
_INGEST = """
INSERT INTO {s}.pipeline_records (level, key, payload, processor, version, updated_ms)
SELECT 1, t.key, t.payload, $3, $4, $5 FROM unnest($1::text[], $2::text[]) AS t(key, payload)
ORDER BY t.key
ON CONFLICT (level, key) DO NOTHING
"""
_MOVE_CURSOR = """
INSERT INTO {s}.pipeline_cursors AS c (name, position, updated_ms) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
SET position = GREATEST(c.position, excluded.position), updated_ms = excluded.updated_ms
"""
_SAVE_CONFIG = """
INSERT INTO {s}.pipeline_worker_config (worker, desired, effective, error, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (worker) DO UPDATE
SET desired = excluded.desired, effective = excluded.effective, error = excluded.error,
    updated_at = excluded.updated_at
"""
_OUTBOX_PENDING = """
SELECT count(*), min(o.seq) FROM {s}.outbox o
WHERE o.seq > $1 AND o.kind = ANY($2::text[])
  AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)
"""
_FUNNEL = f"""
SELECT payload::jsonb ->> 'form_id' AS form, payload::jsonb ->> 'status' AS status,
       count(*) AS n
FROM {{s}}.pipeline_records
WHERE level = 4 AND key >= '{FUNNEL_KEY_PREFIX}' AND key < '{FUNNEL_KEY_PREFIX[:-1]};'
  AND (payload::jsonb ->> 'counted')::boolean
GROUP BY 1, 2 ORDER BY 1, 2
"""
MAX_SEQ = 2**62
#: a listener that has not been heard from for this long is checked with a query
HEALTH_CHECK_SECONDS = 5.0


class ListenWakeups:
    """LISTEN on a session of its own; polls when the session is gone, and reconnects."""

    def __init__(self, loc: PgLocation, level: int) -> None:
        self.loc = loc
        self.wanted = f"{loc.schema}:{level}"
        self.conn: asyncpg.Connection | None = None
        self.reconnects = 0
        self.heard = 0  # notifications for this consumer's level (tests read it)
        self._event = anyio.Event()
        self._checked = 0.0

    @property
    def backend_pid(self) -> int | None:
        """The listening session's server pid (None while there is none)."""
        return None if self.conn is None or self.conn.is_closed() else \
            self.conn.get_server_pid()

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if payload == self.wanted:
            self.heard += 1
            self._event.set()

    def _lost(self, _conn: Any) -> None:
        self._event.set()  # wake the consumer: it polls, then reconnects

    async def connect(self) -> bool:
        """(Re)open the listening session; False (and polling only) if it fails."""
        await self.close()
        try:
            conn = await connection.connect(self.loc)
        except Exception as exc:  # noqa: BLE001 - without a listener the consumer polls
            log.warning("pipeline listener unavailable: %s", exc,
                        extra={"action": "pipeline.listener_failed"})
            return False
        try:
            conn.add_termination_listener(self._lost)
            await conn.add_listener(CHANNEL, self._heard)
        except Exception as exc:  # noqa: BLE001
            await connection.close_quietly(conn)
            log.warning("pipeline listener unavailable: %s", exc,
                        extra={"action": "pipeline.listener_failed"})
            return False
        self.conn = conn
        self._checked = anyio.current_time()
        return True

    async def _alive(self) -> bool:
        conn = self.conn
        if conn is None or conn.is_closed():
            return False
        if anyio.current_time() - self._checked < HEALTH_CHECK_SECONDS:
            return True
        try:
            with anyio.fail_after(HEALTH_CHECK_SECONDS):
                await conn.fetchval("SELECT 1")
        except Exception:  # noqa: BLE001 - any failure means the session is unusable
            return False
        self._checked = anyio.current_time()
        return True

    async def wait(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._event.wait()
        self._event = anyio.Event()
        if not await self._alive():
            log.warning("pipeline listener lost: reconnecting",
                        extra={"action": "pipeline.listener_lost"})
            if await self.connect():
                self.reconnects += 1

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await connection.close_quietly(conn)


class PipelineLevelQueries(PostgresBase):
    if TYPE_CHECKING:  # runner.io.engine.retention.RetentionOps, composed in store.py
        async def check_outbox_floor(self, after_seq: int) -> None: ...

    async def read_outbox(self, after_seq: int, limit: int, upto_seq: int | None = None
                          ) -> list[OutboxEvent]:
        async with self._guard():
            rows = await self._fetch(
                _READ_OUTBOX, after_seq, MAX_SEQ if upto_seq is None else upto_seq, limit)
        await self.check_outbox_floor(after_seq)  # after the read: it vouches for it
        return [OutboxEvent(int(r["seq"]), str(r["kind"]), r["subject"],
                            json.loads(r["payload"]), str(r["at"]), r["form_id"])
                for r in rows]

    async def ingest(self, records: Sequence[NewRecord], source: tuple[str, int],
                     cursor: str | None, position: int | None, now_ms: int) -> int:
        name, version = source
        async with self._transaction():
            new = 0
            if records:
                new = await self._count(_INGEST, [r.key for r in records],
                                        [canonical(r.payload) for r in records],
                                        name, version, now_ms)
            if cursor is not None and position is not None:
                await self._count(_MOVE_CURSOR, cursor, position, now_ms)
        return new

    async def cursor_position(self, cursor: str) -> int:
        async with self._guard():
            rows = await self._fetch(
                "SELECT position FROM {s}.pipeline_cursors WHERE name = $1", cursor)
        return int(rows[0]["position"]) if rows else 0

    async def outbox_last_seq(self) -> int:
        async with self._guard():
            rows = await self._fetch("SELECT coalesce(max(seq), 0) AS last FROM {s}.outbox")
        return int(rows[0]["last"])

    async def outbox_pending(self, after_seq: int, kinds: Sequence[str]) -> int:
        count, _ = await self._outbox_pending(after_seq, kinds)
        return count

    async def outbox_first_pending(self, after_seq: int, kinds: Sequence[str]) -> int | None:
        _, first = await self._outbox_pending(after_seq, kinds)
        return first

    async def _outbox_pending(self, after_seq: int, kinds: Sequence[str]
                              ) -> tuple[int, int | None]:
        if not kinds:
            return 0, None
        async with self._guard():
            rows = await self._fetch(_OUTBOX_PENDING, after_seq, list(kinds))
        first = rows[0][1]
        return int(rows[0][0]), None if first is None else int(first)

    async def record_worker_config(self, view: WorkerConfigView) -> None:
        desired = None if view.desired is None else canonical(view.desired)
        async with self._guard():
            await self._count(_SAVE_CONFIG, view.worker, desired, canonical(view.effective),
                              view.error, view.updated_at)

    async def worker_configs(self) -> list[WorkerConfigView]:
        async with self._guard():
            rows = await self._fetch(
                "SELECT worker, desired, effective, error, updated_at "
                "FROM {s}.pipeline_worker_config ORDER BY worker")
        return [WorkerConfigView(str(r["worker"]),
                                 None if r["desired"] is None else json.loads(r["desired"]),
                                 json.loads(r["effective"]), r["error"], str(r["updated_at"]))
                for r in rows]

    async def level_counts(self) -> LevelCounts:
        async with self._guard():
            rows = await self._fetch(
                "SELECT level, count(*) AS n FROM {s}.pipeline_records GROUP BY level")
            history = await self._fetch("SELECT count(*) AS n FROM {s}.pipeline_history")
        counts = {level: 0 for level in (1, 2, 3, 4)}
        counts.update({int(r["level"]): int(r["n"]) for r in rows})
        return LevelCounts(counts, int(history[0]["n"]))

    async def funnel(self) -> dict[str, dict[str, int]]:
        async with self._guard():
            rows = await self._fetch(_FUNNEL)
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            out.setdefault(str(r["form"]), {})[str(r["status"])] = int(r["n"])
        return out

    async def iter_level(self, level: int
                         ) -> AsyncIterator[tuple[str, Mapping[str, Any], int]]:
        after = ""
        while True:
            async with self._guard():
                rows = await self._fetch(
                    "SELECT key, payload, rev FROM {s}.pipeline_records "
                    "WHERE level = $1 AND key > $2 ORDER BY key LIMIT 1000", level, after)
            for r in rows:
                yield str(r["key"]), json.loads(r["payload"]), int(r["rev"])
            if len(rows) < 1000:
                return
            after = str(rows[-1]["key"])

    @asynccontextmanager
    async def wakeups(self, stage: Stage) -> AsyncIterator[ListenWakeups]:
        wake = ListenWakeups(self.location, stage.input_level)
        await wake.connect()
        try:
            yield wake
        finally:
            with anyio.CancelScope(shield=True):
                await wake.close()
