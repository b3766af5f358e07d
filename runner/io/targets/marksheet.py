"""The reference server's batch marks (``runner target-serve --marks``, issue 30), kept in
its sheet's own SQLite file, atomically with the rows.

The sheet is the synthetic target's file (``runner.io.synthetic_target``: its documented
``sheet`` table).  Beside it, this module keeps one more table, ``server_mark(one INTEGER
PRIMARY KEY CHECK (one = 1), owner TEXT, seq INTEGER NOT NULL)`` (one row; SQLite's
INTEGER is 64 bits, a seq fits), and an index of the sheet by (tenant, source_lead_id)
for ``read_keys``.  A marked append is one ``BEGIN IMMEDIATE`` transaction on a connection
of its own: the mark is read, judged (:func:`runner.leads.marks.judge`), and only then are
the rows inserted (only those whose write_id the sheet does not hold, with ``once``) and
the new mark written, and committed together; a refusal rolls back having written
nothing.  The write lock is held from the read of the mark to the commit, so concurrent
appends (threads, or two servers on one file) serialise on it.

Errors are the synthetic target's: the lock not taken within the busy timeout is
``BeforeWriteError`` (nothing written); a failure after it is ``AmbiguousWriteError``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from runner.leads.marks import NO_MARK, BatchMark, Key, TargetMark, judge
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    TargetReadError,
    TargetRow,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord

MARK_TABLE = """
CREATE TABLE IF NOT EXISTS server_mark (
    one   INTEGER PRIMARY KEY CHECK (one = 1),
    owner TEXT,
    seq   INTEGER NOT NULL DEFAULT 0
)"""
KEY_INDEX = "CREATE INDEX IF NOT EXISTS sheet_by_key ON sheet (tenant, source_lead_id)"
_COLUMNS = "write_id, tenant, source, source_lead_id, is_test, contact_alias, status"
_INSERT = ("INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, "
           f"contact_alias) VALUES (?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}")
#: SQLite's bound on parameters, with room
_CHUNK = 400
BUSY_TIMEOUT = 30.0


def _row(row: Sequence[Any]) -> TargetRow:
    is_test = row[4]
    if is_test in (0, 1) and not isinstance(is_test, str):
        is_test = bool(is_test)
    return TargetRow(row[0], {"tenant": row[1], "source": row[2], "source_lead_id": row[3],
                              "is_test": is_test, "contact_alias": row[5]}, row[6])


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class MarkedSheet:
    """The marks of a sheet file the server has opened (and so made) already."""

    def __init__(self, path: str, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._conn = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True,
                                     isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        with self._mutex:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute(MARK_TABLE)
                self._conn.execute(KEY_INDEX)
                self._conn.execute("INSERT OR IGNORE INTO server_mark (one) VALUES (1)")
                self._conn.execute("COMMIT")
            except BaseException:
                _rollback(self._conn)
                raise

    def close(self) -> None:
        with self._mutex:
            self._conn.close()

    def _held(self) -> TargetMark:
        row = self._conn.execute("SELECT owner, seq FROM server_mark").fetchone()
        return NO_MARK if row is None or row[0] is None else TargetMark(str(row[0]),
                                                                        int(row[1]))

    def read_mark(self) -> TargetMark:
        with self._mutex:
            try:
                return self._held()
            except sqlite3.Error as exc:
                raise TargetReadError(f"the mark was not read: {exc}") from None

    def fence(self, mark: BatchMark, replaces: str | None = None) -> TargetMark:
        """The fence alone (``raise_mark``): judged and kept as an append's mark, in one
        transaction; the mark it replaced."""
        return self._apply([], mark, replaces, once=False)[2]

    def append(self, items: Sequence[tuple[CRMRecord, str]], mark: BatchMark | None,
               replaces: str | None = None, *, once: bool = False
               ) -> tuple[int, list[TargetRow]]:
        """Judge ``mark`` and, if it may apply, append ``items`` (only the write_ids the
        sheet does not hold, with ``once``) and keep the mark, in one transaction.  Returns
        the rows made and (with ``once``) every row held for the items' write_ids."""
        made, rows, _ = self._apply(items, mark, replaces, once=once)
        return made, rows

    def _apply(self, items: Sequence[tuple[CRMRecord, str]], mark: BatchMark | None,
               replaces: str | None, *, once: bool
               ) -> tuple[int, list[TargetRow], TargetMark]:
        """Judge ``mark`` and, if it may apply, append ``items`` (only the write_ids the
        sheet does not hold, with ``once``) and keep the mark, in one transaction.  Returns
        the rows made and (with ``once``) every row held for the items' write_ids.
        ``items`` empty: the fence alone (``raise_mark``)."""
        with self._mutex:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise BeforeWriteError(f"the sheet was not written (its lock: {exc})") \
                    from None
            try:
                held = self._held()
                if mark is not None:
                    judge(held, mark, replaces)
                made, rows = self._insert(conn, items, once)
                if mark is not None:
                    conn.execute("INSERT INTO server_mark (one, owner, seq) VALUES (1, ?, ?) "
                                 "ON CONFLICT (one) DO UPDATE SET owner = excluded.owner, "
                                 "seq = excluded.seq", (mark.store_id, mark.seq))
                conn.execute("COMMIT")
            except BeforeWriteError:
                _rollback(conn)  # refused by its mark: nothing written
                raise
            except sqlite3.Error as exc:
                _rollback(conn)
                raise AmbiguousWriteError(f"the sheet write failed: {exc}") from None
            except BaseException:
                _rollback(conn)
                raise
        return made, rows, held

    @staticmethod
    def _insert(conn: sqlite3.Connection, items: Sequence[tuple[CRMRecord, str]],
                once: bool) -> tuple[int, list[TargetRow]]:
        values = [(write_id, r.tenant, r.source, r.source_lead_id, int(r.is_test),
                   r.contact_alias) for r, write_id in items]
        rows: list[TargetRow] = []
        if once:
            wanted = list(dict.fromkeys(write_id for _, write_id in items))
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                rows += [_row(r) for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM sheet WHERE write_id IN "
                    f"({','.join('?' * len(chunk))}) ORDER BY row_id", chunk)]
            held = {row.write_id for row in rows}
            fresh = []
            for value in values:
                if value[0] not in held:
                    held.add(value[0])
                    fresh.append(value)
            values = fresh
        if not once:
            conn.executemany(_INSERT.partition(" RETURNING")[0], values)
        for value in values if once else ():
            rows.append(_row(conn.execute(_INSERT, value).fetchone()))
        return len(values), rows

    def read_by_keys(self, keys: Sequence[Key]) -> list[TargetRow]:
        """Every row of the sheet whose (tenant, source_lead_id) is one of ``keys``."""
        found: list[TargetRow] = []
        wanted = list(dict.fromkeys(keys))
        with self._mutex:
            try:
                for start in range(0, len(wanted), _CHUNK):
                    chunk = wanted[start : start + _CHUNK]
                    pairs = ",".join(["(?, ?)"] * len(chunk))
                    found += [_row(r) for r in self._conn.execute(
                        f"SELECT {_COLUMNS} FROM sheet WHERE (tenant, source_lead_id) IN "
                        f"(VALUES {pairs}) ORDER BY row_id",
                        [part for key in chunk for part in key])]
            except sqlite3.Error as exc:
                raise TargetReadError(f"the sheet was not read: {exc}") from None
        return found
