"""Plumbing shared by the SQLite query mixins: one connection, one lock, error translation.

Every awaited call on an aiosqlite connection is a hop to its worker thread, and the hop,
not SQLite, is what costs.  So each operation is as few statements as it can be.  An
anyio lock keeps the coroutines that share the connection from interleaving statements of
different transactions.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio

from runner.io.engine.base import Db, Row, StoreBase
from runner.io.engine.queries import load
from runner.io.sqlite import connection
from runner.storedata import ScopeData

if TYPE_CHECKING:
    from runner.io.filelock import FileLock


QUERIES = load("runner.io.sqlite")


def bindable(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """SQLite binds no lists: a list goes as JSON text (the SQL reads it with json_each)."""
    if any(isinstance(v, list | tuple) for v in params.values()):
        return {k: json.dumps(v) if isinstance(v, list | tuple) else v
                for k, v in params.items()}
    return params


class SQLiteBase(StoreBase, Db):
    """The connection port on one aiosqlite connection (its own thread): named statements
    bind ``:param`` natively, ``transaction()`` is ``BEGIN IMMEDIATE``, ``reading()`` a
    WAL read transaction."""

    backend = "sqlite"

    def __init__(
        self, conn: aiosqlite.Connection, path: str, scope: ScopeData | None, version: int
    ) -> None:
        self._conn = conn
        self.path = path
        # fast: an uncontended acquire does not yield first (every holder awaits its
        # statement at once, which yields anyway); a cancelled caller still stops here
        self._setup(scope, version, anyio.Lock(fast_acquire=True))

    async def aclose(self) -> None:
        await connection.close_quietly(self._conn)

    async def reconnect(self) -> None:
        """Nothing to do: a file has no session to lose (a SQLite store never raises
        ``StoreUnavailable``, so nothing asks for this but a caller written for both)."""

    def worker_lock(self) -> FileLock:
        from runner.io.filelock import FileLock, lock_path_for  # workers only, not status

        return FileLock(lock_path_for(self.path))

    # -- the connection port (runner.io.engine.base.Db) ------------------------------------

    async def fetch(self, name: str, /, **params: Any) -> Sequence[Row]:
        async with self._guard():
            return await self._fetchall(QUERIES[name].sql, bindable(params))

    async def execute(self, name: str, /, **params: Any) -> int:
        async with self._guard():
            try:
                cursor = await self._conn.execute(QUERIES[name].sql, bindable(params))
                count = cursor.rowcount
                await cursor.close()
            except sqlite3.Error as exc:
                raise connection.translate(exc, "writing the store", self.path) from None
        return count

    async def execute_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        async with self._guard():
            await self._executemany(QUERIES[name].sql, [bindable(r) for r in rows])

    def transaction(self) -> AbstractAsyncContextManager[None]:
        return self._transaction()

    async def _fetchall(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[sqlite3.Row]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise connection.translate(exc, "reading or writing the store", self.path) from None

    async def _executemany(
        self, sql: str, rows: Sequence[Sequence[Any] | Mapping[str, Any]]
    ) -> int:
        """Run one statement for many rows; returns the rows it changed (not counting
        rows written by triggers)."""
        try:
            cursor = await self._conn.executemany(sql, rows)
            count = cursor.rowcount
            await cursor.close()
        except sqlite3.Error as exc:
            raise connection.translate(exc, "writing the store", self.path) from None
        return count

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` under the connection lock; rolled back on any
        error, and on cancellation too (in a shielded scope: a half-done transaction must
        never be left open on a shared connection)."""
        async with self._guard():
            await self._begin("BEGIN IMMEDIATE")
            owner, self._owner = self._owner, anyio.get_current_task().id
            try:
                yield
                await self._fetchall("COMMIT")
            except BaseException:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await connection.rollback_quietly(self._conn)
                raise
            finally:
                self._owner = owner

    async def _begin(self, statement: str) -> None:
        """Begin, shielded from cancellation: the BEGIN runs on the connection's thread
        whatever becomes of its caller, and one cut off half-way would leave a
        transaction open for the next caller.  A cancellation that came meanwhile lands
        at the caller's next await, inside its rollback.  Bounded by the busy timeout."""
        with anyio.CancelScope(shield=True):
            await self._fetchall(statement)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """One consistent snapshot for several reads (a WAL read transaction)."""
        async with self._lock:
            await self._begin("BEGIN")
            self._owner = anyio.get_current_task().id
            try:
                yield
            finally:
                self._owner = None
                await connection.rollback_quietly(self._conn)
