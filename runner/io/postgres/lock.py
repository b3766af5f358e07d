"""The worker lock on PostgreSQL (SPEC L7, K1): a session advisory lock.

``pg_try_advisory_lock(key)`` on a session of its own, held for the whole run.  The key
is a stable 64-bit hash of the store's schema and pinned scope, the same on every host,
so a second worker anywhere is refused at once (``LockHeld``, exit 75), named by the
``application_name`` of the session that holds it (``runner pid=… host=…``).  The
server releases the lock when that session ends: the worker exits, its process dies, or
its connection drops (TCP keepalives end the session of a vanished host).

What it cannot fence.  A session advisory lock is held by a *session*, not a process: a
holder cut off by a network partition keeps its session (and the lock) until keepalives
or ``idle_session_timeout`` end it on the server, and it may still have a request on its
way to the target.  Once the server ends that session, another worker may take over
while the old process still runs.  To narrow that window, the in-flight mark checks in
the same statement that this store's lock session still holds the lock (``Fence``): a
worker whose lock session is gone cannot start a new send (``LockLost``, exit 74).  A
send already started cannot be fenced by any lock; that is why a record in flight at a
takeover is made uncertain and only ever reconciled.

The fence names the lock's session by its server backend pid *and* the server instance
(``pg_postmaster_start_time()``): after a restart or a failover a pid means another
session (a container's pids are small numbers, the same on two hosts), so a fence taken
before never matches a session of the new instance.

Riding through a lost server (issue 30, ``runner.tasks.reconnect``).  When the lock's
session ends (its termination listener hears it, or the store's session dropped with it)
the fence is set to :data:`FENCE_LOST` at once: every in-flight mark is refused
(``LockLost``) without a statement until :meth:`AdvisoryLock.regain` has either proven
that the old session still holds the lock on the instance the store's session reaches
now, or taken the lock anew on a new session (``LockHeld``, exit 75, when another worker
took it meanwhile: this one steps aside).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg

from runner.errors import LockHeld, StoreUnavailable
from runner.io.postgres import connection
from runner.io.postgres.dsn import PgLocation
from runner.storedata import ScopeData

_HOLDER = """
SELECT a.application_name, a.pid, host(a.client_addr) AS addr
FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND l.classid = $1 AND l.objid = $2
LIMIT 1
"""
_TAKE = "SELECT pg_try_advisory_lock($1) AS got, pg_postmaster_start_time() AS started"

_APP_NAME = re.compile(r"runner pid=(\d+)(?: host=(\S+))?")


@dataclass(frozen=True)
class Fence:
    """Which session holds the worker lock: an in-flight mark proceeds only while it
    still does (a check in the same statement: ``_finish_and_mark_fenced`` in
    queries.sql).  ``started`` is the server instance of that session
    (``pg_postmaster_start_time()``)."""

    backend_pid: int
    classid: int
    objid: int
    started: datetime

    def params(self) -> dict[str, Any]:
        return {"pid": self.backend_pid, "classid": self.classid, "objid": self.objid,
                "started": self.started}


#: the fence of a lock whose session has ended: no session ever matches it (pid 0), and
#: the store refuses a mark under it without asking the server
FENCE_LOST = Fence(0, 0, 0, datetime(1970, 1, 1, tzinfo=UTC))

#: seconds the lock's session may take to answer whether it is alive (``regain``)
PROBE_TIMEOUT = 5.0

Verify = Callable[[Fence], Awaitable[bool]]


def worker_lock_key(schema: str, scope: ScopeData | None) -> int:
    pinned = json.dumps(scope, sort_keys=True, separators=(",", ":")) if scope else ""
    return connection.stable_key("runner.worker-lock", schema, pinned)


def split_key(key: int) -> tuple[int, int]:
    """The (classid, objid) pair under which ``pg_locks`` shows a bigint advisory key."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


class AdvisoryLock:
    """An exclusive, non-blocking lock held by a dedicated session for the whole run.

    ``on_change`` hears the fence whenever it changes (the store's in-flight marks check
    it); ``verify`` asks the *store's* session whether a fence holds there (the lock's
    session and the store's reach the same server instance, and the lock is held)."""

    def __init__(
        self, loc: PgLocation, scope: ScopeData | None,
        on_change: Callable[[Fence | None], None] | None = None,
        verify: Verify | None = None,
    ) -> None:
        self.location = loc
        self.key = worker_lock_key(loc.schema, scope)
        self._on_change = on_change or (lambda _fence: None)
        self._verify = verify
        self._conn: asyncpg.Connection | None = None
        self._fence: Fence | None = None
        self._lost: anyio.Event | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    @property
    def lost(self) -> bool:
        """The lock's session ended under us: nothing is fenced by it any more."""
        return self._fence is FENCE_LOST

    async def wait_lost(self) -> None:
        """Until the lock's session ends (at once if it has)."""
        if self._lost is None:
            self._lost = anyio.Event()
        if self.lost:
            return
        await self._lost.wait()

    def _set(self, fence: Fence | None) -> None:
        self._fence = fence
        self._on_change(fence)
        if fence is FENCE_LOST and self._lost is not None:
            self._lost.set()

    def _ended(self, conn: Any) -> None:
        """The termination listener of the lock's session (asyncpg calls it on the loop
        when the session closes under us)."""
        if conn is self._conn:
            self._set(FENCE_LOST)

    async def acquire(self) -> None:
        if self._conn is not None:
            return
        conn = await connection.connect(self.location)
        classid, objid = split_key(self.key)
        try:
            row = await conn.fetchrow(_TAKE, self.key)
            assert row is not None  # one row, always
            if not row["got"]:
                holder = await conn.fetchrow(_HOLDER, classid, objid)
                raise _refusal(self.location, holder)
        except BaseException as exc:
            await connection.close_quietly(conn)
            if isinstance(exc, connection.TRANSLATED):
                raise connection.translate(
                    exc, "taking the worker lock", self.location.where) from None
            raise
        self._conn = conn
        if self._lost is not None and self._lost.is_set():
            self._lost = anyio.Event()
        conn.add_termination_listener(self._ended)
        fence = Fence(conn.get_server_pid(), classid, objid, row["started"])
        self._set(fence)
        try:
            same = self._verify is None or await self._verify(fence)
        except BaseException:
            await self.release()
            raise
        if not same:
            await self.release()
            raise StoreUnavailable(
                "the worker lock's session and the store's session reached different "
                f"servers ({self.location.where}): a primary and a standby in the middle "
                "of a failover, or two primaries")

    async def regain(self) -> bool:
        """After the store's session was opened anew: True if the lock's session still
        holds the lock, on the server instance the store's session reaches (asked there);
        else that session is dropped and the lock taken anew (False: what was in flight
        must be recovered).  Raises ``LockHeld`` (exit 75) when another worker took it
        meanwhile, ``StoreUnavailable`` while the server cannot say."""
        fence, conn = self._fence, self._conn
        if (conn is not None and not conn.is_closed() and fence is not None
                and fence is not FENCE_LOST and await self._alive(conn)
                and (self._verify is None or await self._verify(fence))):
            return True
        self._drop()
        await self.acquire()
        return False

    async def _alive(self, conn: asyncpg.Connection) -> bool:
        """Whether the lock's own session answers (bounded)."""
        try:
            with anyio.fail_after(PROBE_TIMEOUT):
                await conn.fetchval("SELECT 1")
        except (TimeoutError, *connection.TRANSLATED):
            return False
        return True

    def _drop(self) -> None:
        """Let go of a lock session that is gone (or no longer trusted): nothing is
        fenced by it from now on."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.remove_termination_listener(self._ended)
            if not conn.is_closed():
                conn.terminate()  # the server ends the session, and the lock with it
        self._set(FENCE_LOST)

    async def release(self) -> None:
        """Unlock explicitly (so the next worker need not wait for the session to wind
        down), then end the session.  A session that is already gone released it."""
        if self._conn is None:
            if self._fence is not None:
                self._set(None)
            return
        conn, self._conn = self._conn, None
        conn.remove_termination_listener(self._ended)
        self._set(None)
        # shielded: a cancelled worker still lets go at once (bounded, for a dead server)
        # (a session that is gone took the lock along)
        if not conn.is_closed():
            with (anyio.CancelScope(shield=True),
                  anyio.move_on_after(connection.CLOSE_TIMEOUT),
                  contextlib.suppress(*connection.TRANSLATED)):
                await conn.execute("SELECT pg_advisory_unlock($1)", self.key)
        await connection.close_quietly(conn)

    async def __aenter__(self) -> AdvisoryLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()


def _refusal(loc: PgLocation, holder: Any) -> LockHeld:
    where = f"store {loc.schema!r} at {loc.where}"
    if holder is None:  # released in between: still refuse; the caller may retry
        return LockHeld(f"another worker holds the lock on {where}; not starting")
    match = _APP_NAME.fullmatch(holder["application_name"] or "")
    if match is None:
        return LockHeld(
            f"another session (server backend {holder['pid']}, application "
            f"{holder['application_name']!r}) holds the lock on {where}; not starting")
    pid = int(match.group(1))
    host = match.group(2) or holder["addr"] or "this host"
    return LockHeld(
        f"another worker (pid {pid} on {host}) holds the lock on {where}; not starting",
        holder_pid=pid,
    )
