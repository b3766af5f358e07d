"""The SQLite Store adapter (SPEC K1): one aiosqlite connection, one transaction per operation.

Every awaited call on an aiosqlite connection is a hop to its worker thread, and the hop,
not SQLite, is what costs.  So each operation is as few statements as it can be: accept
is one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` whose outbox row is written by a
trigger (a duplicate costs one more read).  An anyio lock keeps the coroutines that share
the connection from interleaving statements of different transactions.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from datetime import datetime
from typing import Any

import aiosqlite
import anyio

from runner.clock import to_text
from runner.errors import RunnerError
from runner.io.sqlite import connection
from runner.models import LeadEvent, Scope, WriteId
from runner.states import LeadState
from runner.store import AcceptOutcome, LeadRow, StoreSummary

_ACCEPT = """
INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, state,
                   accepted_at, updated_at)
VALUES (?, ?, ?, ?, 'prepared', ?, ?)
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING write_id
"""
_EXISTING = "SELECT canonical, write_id FROM leads WHERE tenant_id = ? AND source_lead_id = ?"
_RECORD_COLUMNS = (
    "seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts, "
    "snapshot, last_polled_at"
)
_RECORD_PAGE = f"SELECT {_RECORD_COLUMNS} FROM leads WHERE seq > ? ORDER BY seq LIMIT ?"


def row_to_lead(row: Sequence[Any]) -> LeadRow:
    snapshot = json.loads(row[7]) if row[7] is not None else None
    return LeadRow(
        seq=int(row[0]),
        tenant_id=str(row[1]),
        source_lead_id=str(row[2]),
        write_id=WriteId(str(row[3])),
        state=LeadState(row[4]),
        attempts=int(row[5]),
        reconcile_attempts=int(row[6]),
        snapshot=snapshot,
        last_polled_at=row[8],
    )


class SQLiteStore:
    backend = "sqlite"

    def __init__(
        self, conn: aiosqlite.Connection, path: str, scope: Scope | None, version: int
    ) -> None:
        self._conn = conn
        self.path = path
        self._scope = scope
        self.schema_version = version
        self._lock = anyio.Lock()
        self._reading = False

    @property
    def scope(self) -> Scope | None:
        return self._scope

    async def aclose(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- plumbing ---------------------------------------------------------------------

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        # inside reading() the lock is already ours (anyio.Lock is not reentrant)
        return nullcontext() if self._reading else self._lock

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise connection.translate(exc, "reading or writing the store") from None

    # -- lead operations --------------------------------------------------------------

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        at = to_text(now)
        key = (event.tenant_id, event.source_lead_id)
        async with self._guard():
            inserted = await self._fetchall(_ACCEPT, (*key, canonical, write_id, at, at))
            if inserted:
                return AcceptOutcome("accepted", WriteId(inserted[0][0]))
            existing = await self._fetchall(_EXISTING, key)
        if not existing:  # records are never deleted, so this cannot happen
            raise RunnerError("accept found neither a new nor an existing record")
        stored, stored_write_id = existing[0]
        if stored == canonical:
            return AcceptOutcome("duplicate", WriteId(stored_write_id))
        return AcceptOutcome("conflict", WriteId(stored_write_id))

    # -- reading ----------------------------------------------------------------------

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """One consistent snapshot for several reads (a WAL read transaction)."""
        async with self._lock:
            await self._fetchall("BEGIN")
            self._reading = True
            try:
                yield
            finally:
                self._reading = False
                await connection.rollback_quietly(self._conn)

    async def summary(self) -> StoreSummary:
        async with self._guard():
            states = await self._fetchall("SELECT state, count(*) FROM leads GROUP BY state")
            kinds = await self._fetchall("SELECT kind, count(*) FROM outbox GROUP BY kind")
            last = await self._fetchall("SELECT coalesce(max(seq), 0) FROM outbox")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(state): int(n) for state, n in states})
        by_kind = {str(kind): int(n) for kind, n in kinds}
        return StoreSummary(
            scope=self._scope,
            schema_version=self.schema_version,
            counts=counts,
            outbox_count=sum(by_kind.values()),
            outbox_last_seq=int(last[0][0]),
            outbox_by_kind=by_kind,
        )

    async def iter_records(self, *, page: int = 1000) -> AsyncIterator[LeadRow]:
        after = 0
        while True:
            async with self._guard():
                rows = await self._fetchall(_RECORD_PAGE, (after, page))
            for row in rows:
                yield row_to_lead(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])


async def open_sqlite_store(
    location: str, *, scope: Scope | None, create: bool
) -> SQLiteStore:
    path = connection.prepare_path(location, create=create)
    conn = await connection.connect(path, create=create)
    try:
        if create:
            version, pinned = await connection.migrate_and_pin(conn, path, scope)
        else:
            version, pinned = await connection.inspect(conn, path, scope)
    except sqlite3.Error as exc:
        await conn.close()
        raise connection.translate(exc, "opening the store") from None
    except BaseException:
        await conn.close()
        raise
    return SQLiteStore(conn, path, pinned, version)
