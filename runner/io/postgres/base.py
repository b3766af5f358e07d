"""Plumbing shared by the PostgreSQL query mixins: one session, one lock, error translation.

An asyncpg connection runs one statement at a time, so an anyio lock keeps coroutines
that share the store from interleaving.  Each operation is one statement (a CTE with
``RETURNING`` where it reads and writes), so one round trip and one transaction.  SQL is
written with ``{s}`` for the schema and qualified once per store (``self._sql``).

A statement the server aborts because of a deadlock or a serialization failure changed
nothing, so it is simply run again (a few times); every other error is translated.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from functools import lru_cache
from typing import Any

import anyio
import asyncpg

from runner.errors import StoreBusy
from runner.io.postgres import connection
from runner.io.postgres.dsn import PgLocation
from runner.io.postgres.lock import AdvisoryLock, Fence
from runner.io.postgres.schema import render
from runner.models import Scope

_RETRIES = 5
_RETRYABLE = (asyncpg.exceptions.DeadlockDetectedError,
              asyncpg.exceptions.SerializationError)


class PostgresBase:
    backend = "postgres"

    def __init__(
        self, conn: asyncpg.Connection, loc: PgLocation, scope: Scope | None, version: int
    ) -> None:
        self._conn = conn
        self.location = loc
        self._scope = scope
        self.schema_version = version
        self._lock = anyio.Lock()
        self._reading = False
        #: set while this store's worker lock is held: the in-flight mark checks it
        self._fence: Fence | None = None

    @property
    def scope(self) -> Scope | None:
        return self._scope

    async def aclose(self) -> None:
        await connection.close_quietly(self._conn)

    def worker_lock(self) -> AdvisoryLock:
        return AdvisoryLock(self.location, self._scope, on_change=self._set_fence)

    def _set_fence(self, fence: Fence | None) -> None:
        self._fence = fence

    def _sql(self, template: str) -> str:
        return _qualified(template, self.location.schema_ident)

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        # inside reading() the lock is already ours (anyio.Lock is not reentrant)
        return nullcontext() if self._reading else self._lock

    async def _fetch(self, template: str, *args: Any) -> Sequence[asyncpg.Record]:
        sql = self._sql(template)
        for attempt in range(_RETRIES):
            try:
                return await self._conn.fetch(sql, *args)
            except _RETRYABLE:
                if self._reading or attempt == _RETRIES - 1:
                    raise StoreBusy("the store kept aborting a write as a deadlock victim; "
                                    "try again") from None
                await anyio.sleep(0.01 * (attempt + 1))
            except connection.TRANSLATED as exc:
                raise connection.translate(
                    exc, "reading or writing the store", self.location.where) from None
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """One consistent snapshot for several reads (a read-only repeatable-read
        transaction: it takes no locks and never waits for writers)."""
        async with self._lock:
            transaction = self._conn.transaction(isolation="repeatable_read", readonly=True)
            try:
                await transaction.start()
            except connection.TRANSLATED as exc:
                raise connection.translate(
                    exc, "reading the store", self.location.where) from None
            self._reading = True
            try:
                yield
            finally:
                self._reading = False
                # the session may be gone: the read already failed or finished
                with contextlib.suppress(*connection.TRANSLATED):
                    await transaction.rollback()


@lru_cache(maxsize=256)
def _qualified(template: str, schema_ident: str) -> str:
    return render(template, schema_ident)
