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
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg

from runner.errors import LockHeld
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

_APP_NAME = re.compile(r"runner pid=(\d+)(?: host=(\S+))?")


@dataclass(frozen=True)
class Fence:
    """Which session holds the worker lock: an in-flight mark proceeds only while it
    still does (a check in the same statement: ``_finish_and_mark_fenced`` in
    queries.sql)."""

    backend_pid: int
    classid: int
    objid: int

    def params(self) -> dict[str, int]:
        return {"pid": self.backend_pid, "classid": self.classid, "objid": self.objid}


def worker_lock_key(schema: str, scope: ScopeData | None) -> int:
    pinned = json.dumps(scope, sort_keys=True, separators=(",", ":")) if scope else ""
    return connection.stable_key("runner.worker-lock", schema, pinned)


def split_key(key: int) -> tuple[int, int]:
    """The (classid, objid) pair under which ``pg_locks`` shows a bigint advisory key."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


class AdvisoryLock:
    """An exclusive, non-blocking lock held by a dedicated session for the whole run."""

    def __init__(
        self, loc: PgLocation, scope: ScopeData | None,
        on_change: Callable[[Fence | None], None] | None = None,
    ) -> None:
        self.location = loc
        self.key = worker_lock_key(loc.schema, scope)
        self._on_change = on_change or (lambda _fence: None)
        self._conn: asyncpg.Connection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    async def acquire(self) -> None:
        if self._conn is not None:
            return
        conn = await connection.connect(self.location)
        classid, objid = split_key(self.key)
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key):
                holder = await conn.fetchrow(_HOLDER, classid, objid)
                raise _refusal(self.location, holder)
        except BaseException as exc:
            await connection.close_quietly(conn)
            if isinstance(exc, connection.TRANSLATED):
                raise connection.translate(
                    exc, "taking the worker lock", self.location.where) from None
            raise
        self._conn = conn
        self._on_change(Fence(conn.get_server_pid(), classid, objid))

    async def release(self) -> None:
        """Unlock explicitly (so the next worker need not wait for the session to wind
        down), then end the session.  A session that is already gone released it."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        self._on_change(None)
        # shielded: a cancelled worker still lets go at once (bounded, for a dead server)
        # (a session that is gone took the lock along)
        with (anyio.CancelScope(shield=True), anyio.move_on_after(connection.CLOSE_TIMEOUT),
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
