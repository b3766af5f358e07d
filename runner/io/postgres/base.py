"""Plumbing shared by the PostgreSQL query mixins: one session, one lock, error translation.

An asyncpg connection runs one statement at a time, so an anyio lock keeps coroutines
that share the store from interleaving.  Each operation is one statement (a CTE with
``RETURNING`` where it reads and writes), so one round trip and one transaction.  SQL is
written with ``{s}`` for the schema and qualified once per store (``self._sql``).

A statement the server aborts because of a deadlock or a serialization failure changed
nothing, so it is simply run again (a few times); every other error is translated.

A session that is lost (``StoreUnavailable``: the server restarted, failed over, or the
network dropped) is replaced by :meth:`PostgresBase.reconnect`, in place, so every holder
of the store (the lead loop, the HTTP intake beside it) goes on with the new session.  A
reconnect opens a session through the same DSN (a multi-host DSN with
``target_session_attrs=read-write`` reaches whichever host is writable now) and checks,
read-only, that it reaches the same store: its schema version and pinned scope.  It never
creates a store: a server that has none (a failover to the wrong cluster) is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import anyio
import asyncpg
from asyncpg.transaction import Transaction

from runner.errors import ConfigMismatch, StoreBusy, StoreUnavailable
from runner.io.engine.base import Db, Row, StoreBase
from runner.io.engine.queries import load
from runner.io.postgres import connection
from runner.io.postgres.dsn import PgLocation
from runner.io.postgres.lock import AdvisoryLock, Fence
from runner.io.postgres.schema import render
from runner.storedata import ScopeData

if TYPE_CHECKING:
    pass

QUERIES = load("runner.io.postgres")
#: each query's SQL with ``$n`` placeholders, and its parameter names in that order
NUMBERED = {name: (q.numbered(), q.params) for name, q in QUERIES.items()}
_RETRIES = 5
#: seconds a BEGIN or a COMMIT may take before the session is given up (neither waits
#: for a lock)
BEGIN_TIMEOUT = 30.0
_READ_IDLE = (f"SET LOCAL {connection.IDLE_SETTING} = "
              f"'{connection.READ_IDLE_TIMEOUT}'")
_RETRYABLE = (asyncpg.exceptions.DeadlockDetectedError,
              asyncpg.exceptions.SerializationError)


class PostgresBase(StoreBase, Db):
    """The connection port on one asyncpg session: named statements become ``$n`` SQL in
    the store's schema, deadlock victims are run again, ``reading()`` is a read-only
    repeatable-read snapshot."""

    backend = "postgres"

    def __init__(
        self, conn: asyncpg.Connection, loc: PgLocation, scope: ScopeData | None, version: int
    ) -> None:
        self._conn = conn
        self.location = loc
        self._setup(scope, version, anyio.Lock())
        #: set while this store's worker lock is held: the in-flight mark checks it
        self._fence: Fence | None = None

    async def aclose(self) -> None:
        await connection.close_quietly(self._conn)

    async def reconnect(self) -> None:
        """A new session in place of one that was lost (``StoreUnavailable``), checked to
        reach the same store (schema version, pinned scope; read-only, never creating
        anything).  Raises ``StoreUnavailable`` while the server cannot be reached, and
        ``ConfigMismatch``/``StoreNotFound`` (which no reconnect cures) when it reaches
        another store or none."""
        old = self._conn
        if not old.is_closed():
            old.terminate()  # a statement still waiting on it fails now, not in a minute
        conn = await connection.connect(self.location)
        try:
            version, pinned = await connection.inspect(conn, self.location, None)
        except BaseException as exc:
            await connection.close_quietly(conn)
            if isinstance(exc, connection.TRANSLATED):
                raise connection.translate(
                    exc, "checking the store after reconnecting", self.location.where
                ) from None
            raise
        if version != self.schema_version or pinned != self.scope_data:
            await connection.close_quietly(conn)
            what = ("another scope is pinned there" if pinned != self.scope_data else
                    f"it is at schema v{version}, not v{self.schema_version}")
            raise ConfigMismatch(
                f"after reconnecting, the store in schema {self.location.schema!r} at "
                f"{self.location.where} is not the one this run opened ({what}); "
                "start again")
        async with self._lock:  # no statement of another task runs across the swap
            self._conn = conn
        await self._reconnected()

    def worker_lock(self) -> AdvisoryLock:
        return AdvisoryLock(self.location, self.scope_data, on_change=self._set_fence,
                            verify=self._fence_holds)

    def _set_fence(self, fence: Fence | None) -> None:
        self._fence = fence

    async def _fence_holds(self, fence: Fence) -> bool:
        """Whether ``fence`` holds as this store's session sees it (the same check as the
        in-flight marks')."""
        rows = await self.fetch("_fence_held", **fence.params())
        return bool(rows[0][0])

    def _sql(self, template: str) -> str:
        return _qualified(template, self.location.schema_ident)

    # -- the connection port (runner.io.engine.base.Db) ------------------------------------

    async def fetch(self, name: str, /, **params: Any) -> Sequence[Row]:
        sql, names = NUMBERED[name]
        async with self._guard():
            rows = await self._fetch(sql, *[params[n] for n in names])
        return cast("Sequence[Row]", rows)  # a Record indexes by column number

    async def execute(self, name: str, /, **params: Any) -> int:
        sql, names = NUMBERED[name]
        async with self._guard():
            return await self._count(sql, *[params[n] for n in names])

    async def execute_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        sql, names = NUMBERED[name]
        async with self._guard():
            try:
                await self._conn.executemany(
                    self._sql(sql), [[row[n] for n in names] for row in rows])
            except connection.TRANSLATED as exc:
                raise connection.translate(
                    exc, "writing the store", self.location.where) from None

    def transaction(self) -> AbstractAsyncContextManager[None]:
        return self._transaction()

    async def _fetch(self, template: str, *args: Any) -> Sequence[asyncpg.Record]:
        sql = self._sql(template)
        for attempt in range(_RETRIES):
            try:
                return await self._conn.fetch(sql, *args)
            except _RETRYABLE:
                if self._inside() or attempt == _RETRIES - 1:
                    raise StoreBusy("the store kept aborting a write as a deadlock victim; "
                                    "try again") from None
                await anyio.sleep(0.01 * (attempt + 1))
            except connection.TRANSLATED as exc:
                raise connection.translate(
                    exc, "reading or writing the store", self.location.where) from None
        raise AssertionError("unreachable")

    async def _count(self, template: str, *args: Any) -> int:
        """Run one write statement; the number of rows it changed (triggers excluded)."""
        try:
            status = await self._conn.execute(self._sql(template), *args)
        except connection.TRANSLATED as exc:
            raise connection.translate(
                exc, "writing the store", self.location.where) from None
        return int(status.rsplit(" ", 1)[-1])

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """Several statements as one transaction, under the session lock.  Rolled back on
        any error, and on cancellation too (shielded and bounded: a half-done transaction
        must never be left open on the shared session)."""
        async with self._guard():
            transaction = self._new_transaction("writing the store")
            await self._begin(transaction, "writing the store")
            self._owner = anyio.get_current_task().id
            try:
                yield
            except BaseException:
                await self._rollback(transaction)
                raise
            else:
                await self._commit(transaction)
            finally:
                self._owner = None

    def _new_transaction(self, doing: str, **options: Any) -> Transaction:
        """``Connection.transaction``, whose own check of a closed session raises the
        driver's error before any statement (translated here like every other)."""
        try:
            return self._conn.transaction(**options)
        except connection.TRANSLATED as exc:
            raise connection.translate(exc, doing, self.location.where) from None

    async def _begin(self, transaction: Transaction, doing: str) -> None:
        """Begin, shielded from cancellation (bounded): a BEGIN cut off half-way leaves
        the session, and asyncpg's own bookkeeping, inside a transaction nobody ends.  A
        cancellation that came meanwhile lands at the caller's next await, inside its
        rollback.  A session whose BEGIN failed or did not answer is closed rather than
        reused in an unknown state (later calls fail, 74)."""
        begun = False
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(BEGIN_TIMEOUT):
                await self._call(transaction.start(), doing)
                begun = True
        finally:
            if not begun and not self._conn.is_closed():
                self._conn.terminate()
        if not begun:
            raise StoreUnavailable(f"{doing}: the server did not begin a transaction within "
                                   f"{BEGIN_TIMEOUT:g} s ({self.location.where})")

    async def _commit(self, transaction: Transaction) -> None:
        """Commit, shielded from cancellation (bounded), for the same reason as
        ``_begin``: asyncpg forgets the transaction before its COMMIT is answered, so a
        COMMIT cut off half-way would leave the session inside a transaction that no one
        ends.  A session whose COMMIT did not answer is closed."""
        answered, error = False, None
        with anyio.CancelScope(shield=True), anyio.move_on_after(BEGIN_TIMEOUT):
            try:
                await self._call(transaction.commit(), "writing the store")
            except Exception as exc:  # noqa: BLE001 - an error is an answer; raised below
                error = exc
            answered = True
        if not answered:
            if not self._conn.is_closed():
                self._conn.terminate()
            raise StoreUnavailable(f"writing the store: the server did not answer COMMIT "
                                   f"within {BEGIN_TIMEOUT:g} s ({self.location.where}); "
                                   "whether it committed is unknown")
        if error is not None:
            raise error

    async def _rollback(self, transaction: Transaction) -> None:
        """Roll back, shielded and bounded.  A session whose transaction could not be
        ended is closed rather than reused in an unknown state (later calls fail, 74)."""
        ended = False
        with (anyio.CancelScope(shield=True), anyio.move_on_after(connection.CLOSE_TIMEOUT),
              contextlib.suppress(*connection.TRANSLATED)):
            await transaction.rollback()
            ended = True
        if not ended and not self._conn.is_closed():
            self._conn.terminate()

    async def _call(self, step: Awaitable[object], doing: str) -> None:
        try:
            await step
        except connection.TRANSLATED as exc:
            raise connection.translate(exc, doing, self.location.where) from None

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """One consistent snapshot for several reads (a read-only repeatable-read
        transaction: it takes no row locks and never waits for writers).  It may idle
        longer than a writing transaction (``connection.READ_IDLE_TIMEOUT``: a reader of
        ``status --records`` paging slowly), unless the DSN sets the bound itself."""
        async with self._lock:
            transaction = self._new_transaction("reading the store", isolation="repeatable_read",
                                                readonly=True)
            await self._begin(transaction, "reading the store")
            self._owner = anyio.get_current_task().id
            try:
                if connection.IDLE_SETTING not in self.location.params:
                    await self._call(self._conn.execute(_READ_IDLE), "reading the store")
                yield
            finally:
                self._owner = None
                await self._rollback(transaction)


@lru_cache(maxsize=1024)
def _qualified(template: str, schema_ident: str) -> str:
    return render(template, schema_ident)
