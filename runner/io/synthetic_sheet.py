"""The synthetic target's file (``runner.io.synthetic_target``): its schema, and
:func:`inspect_target`, which judges what is at a target path without changing anything.

The schema: the ``sheet`` (rows as a spreadsheet holds them, duplicates and all), its
lookup indexes, ``target_meta`` (the target's identity) and ``target_mark`` (the batch
mark it keeps).  ``inspect_target`` opens an existing file only to read it (read-only, or
``immutable=1`` for a WAL file with no pending ``-wal``), so a file that is not a target
is left byte for byte as it was.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

from runner.errors import TargetUnavailable, UnsafeLocation

SHEET = """
CREATE TABLE IF NOT EXISTS sheet (
    row_id INTEGER PRIMARY KEY,
    write_id, tenant, source, source_lead_id, is_test, contact_alias,
    status TEXT NOT NULL DEFAULT 'new'
)
"""
#: a lookup index, as a spreadsheet API has its own: without it every readback scans the
#: whole sheet.  It is not a constraint: the sheet still accepts duplicate rows.
SHEET_INDEX = "CREATE INDEX IF NOT EXISTS sheet_by_write_id ON sheet (write_id)"
FIELDS = ("tenant", "source", "source_lead_id", "is_test", "contact_alias")
SHEET_COLUMNS = ("row_id", "write_id", *FIELDS, "status")
#: the target's identity, written once when the target is created (or first opened for
#: writes, for a sheet made before identities existed)
META = "CREATE TABLE IF NOT EXISTS target_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
#: the batch mark the target keeps (SPEC E8, issue 30; ``runner.leads.marks``): the store
#: it belongs to and the highest seq applied, written in the transaction that applies a
#: marked batch (or raises the fence alone); made with the first marked write
MARK = ("CREATE TABLE IF NOT EXISTS target_mark (only_row INTEGER PRIMARY KEY "
        "CHECK (only_row = 1), owner TEXT NOT NULL, seq INTEGER NOT NULL)")
#: reads by business key (a rewind's, ``read_by_keys``): not a constraint either
SHEET_KEY_INDEX = "CREATE INDEX IF NOT EXISTS sheet_by_key ON sheet (tenant, source_lead_id)"
SQLITE_MAGIC = b"SQLite format 3\x00"
#: how long a target call waits for the target's lock (seconds)
BUSY_TIMEOUT = 30.0


@dataclass(frozen=True)
class Found:
    """What is at a target path, judged without changing anything."""

    kind: Literal["absent", "empty", "target"]
    target_id: str | None = None  # a target made before identities existed has none


def is_target(conn: sqlite3.Connection) -> bool | None:
    """True: a sheet of the target's shape; None: no schema at all (a new file); False:
    something else (a foreign database)."""
    tables = {str(row[0]) for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if not objects:
        return None
    if "sheet" not in tables:
        return False
    columns = tuple(str(row[1]) for row in conn.execute("PRAGMA table_info(sheet)"))
    return columns == SHEET_COLUMNS


def read_id(conn: sqlite3.Connection) -> str | None:
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                            "AND name = 'target_meta'").fetchone()
    if not has_meta:
        return None
    row = conn.execute("SELECT value FROM target_meta WHERE key = 'target_id'").fetchone()
    return str(row[0]) if row else None


def inspect_target(path: str, busy_timeout: float = BUSY_TIMEOUT) -> Found:
    """Judge what is at ``path`` (an absolute, checked path) without changing it.

    Raises ``TargetUnavailable`` for a file that cannot be read or is not a target (not
    SQLite; SQLite without a sheet of the target's shape), ``UnsafeLocation`` for a
    symlink planted meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Found("absent")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLocation(f"refusing a symlinked target path {path!r}") from None
        raise TargetUnavailable(f"cannot read the target {path!r}: {exc.strerror}") from None
    try:
        header = os.read(fd, 100)
    finally:
        os.close(fd)
    if not header:
        return Found("empty")
    if not header.startswith(SQLITE_MAGIC):
        raise TargetUnavailable(f"{path!r} is not a SQLite database, so not a target; "
                                "it was left untouched")
    # a WAL database (header bytes 18-19 = 2) with no -wal file has everything in the main
    # file: read it as immutable, which creates no side file at all
    wal = len(header) >= 20 and header[18] == 2 and header[19] == 2
    mode = "immutable=1" if wal and not os.path.exists(path + "-wal") else "mode=ro"
    try:
        conn = sqlite3.connect(f"file:{quote(path)}?{mode}", uri=True)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            shape = is_target(conn)
            if shape is None:
                return Found("empty")
            if not shape:
                raise TargetUnavailable(
                    f"{path!r} is a SQLite database but not a target (no sheet table of the "
                    "target's shape); it was left untouched")
            return Found("target", read_id(conn))
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise TargetUnavailable(f"cannot read the target {path!r}: {exc}") from None
