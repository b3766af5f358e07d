"""The PostgreSQL table target's session (:class:`TableSession`, which the adapter
:class:`~.target.PgTableTarget` is): blocking calls over asyncpg.

runner calls adapters in worker threads, and asyncpg is asynchronous: the session keeps a
private event loop in a daemon thread of its own (:class:`PrivateLoop`) and one
connection on it, and each blocking call hands a coroutine to that loop and waits for its
result, bounded (a connection attempt and each statement have their timeouts, plus
``MARGIN``).  The calls of one adapter are serialized by a lock, as one session runs one
statement at a time.  A kept connection idle for more than ``PING_AFTER`` seconds is
pinged before use and replaced when it fails; a call safe to repeat (a read, the checks
before work) is made once more on a new connection when a kept one turns out gone
(``_repeatable``); reads fail as ``TargetReadError`` (``_reading``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import asyncpg

from runner.io.engine.queries import load
from runner.io.postgres.connection import application_name, session_settings
from runner.io.targets.pgtable.classify import classify_read, session_lost
from runner.io.targets.pgtable.names import TableLocation, parse_location
from runner.leads.port import TargetError, TargetReadError

T = TypeVar("T")

#: seconds a statement may take (``--target-timeout``), and a connection attempt
DEFAULT_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
#: a session idle longer than this is pinged before a batch is sent on it
PING_AFTER = 1.0
PING_TIMEOUT = 5.0
#: beyond asyncpg's own timeouts, how long a caller waits for the loop at most
MARGIN = 5.0


class PrivateLoop:
    """A private asyncio event loop, run forever in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], wait: float) -> T:
        """Run ``coro`` on the loop and wait for it, at most ``wait`` seconds (then the
        coroutine is cancelled and TimeoutError raised)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(wait)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, wait: float) -> None:
        """Cancel what still runs, stop the loop and end its thread (bounded)."""
        async def cancel_the_rest() -> None:
            me = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not me:
                    task.cancel()

        if self.loop.is_running():
            with contextlib.suppress(Exception):  # stopping whatever happens
                asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(wait)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(wait)
        if not self.thread.is_alive():
            self.loop.close()


def server_error(exc: BaseException) -> bool:
    """An error the server answered with a live session (severity ERROR): the session
    is kept; after anything else it is dropped."""
    return isinstance(exc, asyncpg.PostgresError) and str(
        getattr(exc, "severity_en", None) or getattr(exc, "severity", "")).upper() == "ERROR"


class TableSession:
    """The session of a table target: where it is (``target``, a ``postgresql://`` DSN;
    ``table``, a ``--target-table`` name), its SQL by name (``queries.sql``, with the
    table's identifiers in), and the connection kept on the private loop."""

    def __init__(self, target: str, table: str, *, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.location: TableLocation = parse_location(target, table)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        loc = self.location
        self._sql = {name: query.numbered().replace("{t}", loc.ident)
                     .replace("{m}", loc.mark_ident).replace("{k}", f'"{loc.key_index}"')
                     for name, query in load("runner.io.targets.pgtable").items()}
        self._mutex = threading.Lock()
        self._loop: PrivateLoop | None = None
        self._conn: asyncpg.Connection | None = None
        self._last_used = 0.0

    @property
    def where(self) -> str:
        return self.location.describe()

    # -- the loop and the session -------------------------------------------------------

    def _call(self, fn: Callable[[], Awaitable[T]], on_timeout: Callable[[], Exception],
              statements: int = 1) -> T:
        """``await fn()`` on the private loop, from a blocking caller (waiting for at most
        a connection and ``statements`` statements)."""
        async def go() -> T:
            return await fn()

        with self._mutex:
            if self._loop is None:
                self._loop = PrivateLoop(f"runner-pgtable {self.location.name}")
            try:
                return self._loop.run(go(), self.connect_timeout
                                      + statements * self.timeout + MARGIN)
            except TimeoutError:
                raise on_timeout() from None

    async def _session(self) -> asyncpg.Connection:
        """A live session: the one kept, unless it is closed or fails its ping after
        being idle, else a new one.  Raises what connecting raises."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            if time.monotonic() - self._last_used < PING_AFTER:
                return conn
            try:
                await conn.fetchval(self._sql["ping"], timeout=PING_TIMEOUT)
                self._last_used = time.monotonic()
                return conn
            except Exception:  # noqa: BLE001 - a dead session: replaced below
                self._drop()
        self._conn = None
        # the store's session settings (keepalives, the idle-in-transaction bound: a
        # stopped runner holds no lock on the user's table for long), named as a target
        settings = {**session_settings(self.location.pg),
                    "application_name": f"{application_name()} target"[:63]}
        self._conn = await asyncpg.connect(
            self.location.dsn, timeout=self.location.pg.connect_timeout or self.connect_timeout,
            command_timeout=self.timeout, server_settings=settings)
        self._last_used = time.monotonic()
        return self._conn

    async def _repeatable(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``fn(session)`` for a call that is safe to repeat (a read, the checks before
        work): when a session kept from before turns out to be gone (the server ended it
        a moment ago, and the client had not noticed yet), once more on a new one.  A
        write is never repeated here: its failure is classified as it is."""
        kept = self._conn
        conn = await self._session()
        try:
            return await fn(conn)
        except Exception as exc:
            if conn is not kept or not session_lost(exc):
                raise
            self._drop()
            return await fn(await self._session())

    def _drop(self) -> None:
        """Forget the session (ended at once: a session that failed is not reused)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def close(self) -> None:
        """End the session and the loop's thread (bounded, also under an abandoned call)."""
        got = self._mutex.acquire(timeout=self.timeout + MARGIN)
        try:
            loop, self._loop = self._loop, None
            if loop is None:
                return
            if self._conn is not None:
                conn, self._conn = self._conn, None

                async def end() -> None:
                    try:
                        await asyncio.wait_for(conn.close(), MARGIN)
                    except Exception:  # noqa: BLE001 - closing: ended at once instead
                        conn.terminate()

                with contextlib.suppress(Exception):  # stopping whatever happens
                    loop.run(end(), 2 * MARGIN)
            loop.stop(MARGIN)
        finally:
            if got:
                self._mutex.release()

    # -- reads ---------------------------------------------------------------------------

    def _reading(self, fn: Callable[[], Awaitable[T]], doing: str) -> T:
        """A read: any failure is ``TargetReadError``."""
        async def read() -> T:
            try:
                return await fn()
            except Exception as exc:  # noqa: BLE001 - any failure is a failed read
                if not server_error(exc):
                    self._drop()
                raise classify_read(exc, self.where, doing) from None

        try:
            return self._call(read, lambda: TargetReadError(
                f"{doing} from {self.where} did not answer in time"))
        except TargetError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever failed, the read proves nothing
            raise classify_read(exc, self.where, doing) from None

    def _fetch(self, name: str, write_ids: Sequence[str], doing: str) -> list[Any]:
        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            rows = await conn.fetch(self._sql[name], list(write_ids), timeout=self.timeout)
            self._last_used = time.monotonic()
            return list(rows)

        return self._reading(lambda: self._repeatable(fetch), doing)
