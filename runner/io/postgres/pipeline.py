"""PostgreSQL's steps of staged processing (``runner.io.engine.pipeline``, SPEC P2-P4, P9).

A claim is one statement: ``FOR UPDATE SKIP LOCKED`` picks up to ``limit`` claimable
rows, so concurrent claimers on any number of hosts never wait for each other and never
take the same row; the UPDATE marks them with a new fencing token (``nextval``) and the
lease expiry, and returns the inputs with it.

Registering a new processor version locks ``pipeline_records`` in SHARE mode for the rest
of its (short) transaction, so no record can be written between the backlog sync and the
commit without its trigger seeing the new processor: without it, a record committed by
another session in that window would get no work row until the next resync.  Merged
records are written under a transaction advisory lock per key, so two merges of one
record queue instead of losing a field.  Batches of records are written as arrays, one
statement each.

Wake-ups: a consumer listens on a session of its own (``LISTEN runner_pipeline``) and is
woken when its stage gets new input (see ``pipeline_schema``).  The listener is only a
hint: every consumer also polls, so a notification lost to a dropped session, a restart
or a writer with notifications off delays work by at most one poll interval and loses
nothing.  A dead listener session is noticed (its termination callback, or a failed
health check when a wait times out) and replaced at the next wait; until then the
consumer simply polls.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

from runner.io.engine.base import Row
from runner.io.postgres import connection
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.connection import stable_key
from runner.io.postgres.dsn import PgLocation
from runner.io.postgres.pipeline_schema import CHANNEL
from runner.pipeline.model import Stage, canonical

if TYPE_CHECKING:
    from runner.pipeline.model import NewRecord

log = logging.getLogger("runner.pipeline")

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


class PipelineHooks(PostgresBase):
    async def _claim_rows(self, params: Mapping[str, Any]) -> tuple[int, Sequence[Row]]:
        rows = await self.fetch("_claim_pipeline_work", **params)
        return (int(rows[0][6]) if rows else 0), rows

    async def _hold_record_writers(self) -> None:
        await self.fetch("_lock_pipeline_records")

    async def _hold_pipeline_writers(self) -> None:
        await self.fetch("_lock_pipeline_for_prune")
        await self.fetch("_prune_without_jit")

    async def _lock_merge_keys(self, level: int, keys: Sequence[str]) -> None:
        await self.fetch("_lock_pipeline_keys", keys=[
            stable_key("runner.pipeline", self.location.schema, str(level), key)
            for key in keys])

    async def _replace_records(self, rows: Sequence[Mapping[str, Any]], **common: Any
                               ) -> None:
        await self.fetch("replace_pipeline_records", **common, **{
            column: [row[column] for row in rows]
            for column in ("key", "payload", "orders", "input_id")})

    async def _ingest_records(self, records: Sequence[NewRecord], **common: Any) -> int:
        return await self.execute("_ingest_pipeline_records", **common,
                                  key=[r.key for r in records],
                                  payload=[canonical(r.payload) for r in records])

    @asynccontextmanager
    async def wakeups(self, stage: Stage) -> AsyncIterator[ListenWakeups]:
        wake = ListenWakeups(self.location, stage.input_level)
        await wake.connect()
        try:
            yield wake
        finally:
            with anyio.CancelScope(shield=True):
                await wake.close()
