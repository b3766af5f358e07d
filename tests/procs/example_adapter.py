"""A minimal target adapter: JSON rows in a SQLite file of its own.

The example of docs/how-to/target-adapter.md (a test checks the page shows this file as
it is).  Use it with ``runner once --target-adapter example_adapter:make --target rows.db``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence

from runner.leads.models import CRMRecord
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Missing,
    Observation,
    ReadFailure,
    Snapshot,
    TargetReadError,
    TargetRow,
)

TABLE = "CREATE TABLE IF NOT EXISTS rows (write_id TEXT, body TEXT, status TEXT DEFAULT 'new')"


class JsonRowsTarget:
    def __init__(self, path: str) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5, isolation_level=None)
        conn.execute(TABLE)
        return conn

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        try:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")  # until this lock is held, nothing is written
        except sqlite3.Error as exc:
            raise BeforeWriteError(f"not written: {exc}") from None
        try:
            conn.executemany("INSERT INTO rows (write_id, body) VALUES (?, ?)",
                             [(w, json.dumps(r.model_dump())) for r, w in items])
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # after the lock: it may or may not be there
            raise AmbiguousWriteError(f"may be written: {exc}") from None
        finally:
            conn.close()

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.write_batch([(record, write_id)])

    def _rows(self, write_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        marks = ",".join("?" * len(write_ids))
        try:
            conn = self._connect()
            try:
                return conn.execute(f"SELECT write_id, body, status FROM rows "
                                    f"WHERE write_id IN ({marks})", list(write_ids)).fetchall()
            finally:
                conn.close()
        except sqlite3.Error as exc:  # a failed read raises: it never means "no rows"
            raise TargetReadError(f"read failed: {exc}") from None

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        return [TargetRow(w, json.loads(body), status) for w, body, status in
                self._rows(write_ids)]

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return self.read_back_many([write_id])

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        for write_id, _, status in self._rows(write_ids):
            found[write_id].append(status)
        return {w: Missing() if not s else Snapshot({"status": s[0]}) if len(s) == 1
                else ReadFailure("two rows") for w, s in found.items()}


def make(target: str | None) -> JsonRowsTarget:
    """The factory ``--target-adapter`` calls, with the ``--target`` text."""
    if not target:
        raise ValueError("--target names the rows file")
    return JsonRowsTarget(target)
