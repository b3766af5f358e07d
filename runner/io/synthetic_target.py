"""The synthetic CRM target (SPEC L9): a SQLite file that behaves like a spreadsheet.

One table, exactly ``sheet(row_id INTEGER PRIMARY KEY, write_id, tenant, source,
source_lead_id, is_test, contact_alias, status TEXT NOT NULL DEFAULT 'new')``.  Like a
spreadsheet it does not deduplicate: appending the same record twice makes two rows.
Preventing that is the worker's job, and the tests count rows here to prove it.

Errors are translated at this edge: a failure to even open the file means the request
never left (``BeforeWriteError``); a failure during the insert or its commit is ambiguous.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from runner.io import fsguard
from runner.models import CRMRecord
from runner.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Missing,
    Observation,
    ReadFailure,
    Snapshot,
    TargetReadError,
    TargetRow,
)

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


def _as_bool(value: Any) -> Any:
    # SQLite has no boolean: 0/1 are the sheet's false/true; anything else stays as is,
    # so it can never compare equal to a mapped record by accident
    return bool(value) if value in (0, 1) and not isinstance(value, str) else value


class SyntheticTarget:
    """A CRM adapter over a local SQLite file (blocking; runner calls it in a thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._mutex = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            fsguard.check_not_symlink(self.path, "target path")
            fsguard.create_private_file(self.path)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            # committed rows survive the death of any process (they are in the WAL file);
            # the synthetic target does not pay an fsync per row, as a remote CRM's
            # durability is not ours to pay for
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(SHEET)
            conn.execute(SHEET_INDEX)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def write(self, record: CRMRecord, write_id: str) -> None:
        with self._mutex:
            try:
                conn = self._connect()
            except (sqlite3.Error, OSError) as exc:
                raise BeforeWriteError(f"target unavailable: {exc}") from None
            try:
                conn.execute(
                    "INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test,"
                    " contact_alias) VALUES (?, ?, ?, ?, ?, ?)",
                    (write_id, record.tenant, record.source, record.source_lead_id,
                     int(record.is_test), record.contact_alias),
                )
            except sqlite3.Error as exc:
                raise AmbiguousWriteError(f"target write failed: {exc}") from None

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        with self._mutex:
            try:
                rows = self._connect().execute(
                    "SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias,"
                    " status FROM sheet WHERE write_id = ? ORDER BY row_id",
                    (write_id,),
                ).fetchall()
            except (sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target readback failed: {exc}") from None
        return [
            TargetRow(
                write_id=row[0],
                fields={**dict(zip(FIELDS, row[1:6], strict=True)), "is_test": _as_bool(row[4])},
                status=row[6],
            )
            for row in rows
        ]

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        with self._mutex:
            try:
                conn = self._connect()
                for start in range(0, len(write_ids), 500):
                    chunk = list(write_ids[start : start + 500])
                    marks = ",".join("?" * len(chunk))
                    for write_id, status in conn.execute(
                        f"SELECT write_id, status FROM sheet WHERE write_id IN ({marks})",
                        chunk,
                    ):
                        found[write_id].append(status)
            except (sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target status read failed: {exc}") from None
        out: dict[str, Observation] = {}
        for write_id, statuses in found.items():
            if not statuses:
                out[write_id] = Missing()
            elif len(statuses) > 1:
                out[write_id] = ReadFailure(f"ambiguous: {len(statuses)} rows")
            else:
                out[write_id] = Snapshot({"status": statuses[0]})
        return out
