"""Adapters for ``--target-adapter`` tests of SPEC E7: the example adapter with a unique key
on write_id (``make``: it deduplicates, and declares it), and the plain example adapter
declaring nothing (``plain``), over the same kind of file."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from runner.leads.models import CRMRecord
from runner.leads.port import AmbiguousWriteError, BeforeWriteError
from tests.procs.example_adapter import JsonRowsTarget


class DedupingRows(JsonRowsTarget):
    """A second write of a write_id it holds makes no second row (``INSERT OR IGNORE``
    against a unique index), and its answer is the same as a first write's."""

    dedupes_write_id = True

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS rows_by_write_id ON rows (write_id)")
        return conn

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        try:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise BeforeWriteError(f"not written: {exc}") from None
        try:
            conn.executemany("INSERT OR IGNORE INTO rows (write_id, body) VALUES (?, ?)",
                             [(w, json.dumps(r.model_dump())) for r, w in items])
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise AmbiguousWriteError(f"may be written: {exc}") from None
        finally:
            conn.close()


def make(target: str | None) -> DedupingRows:
    return DedupingRows(target or "rows.db")


def plain(target: str | None) -> JsonRowsTarget:
    return JsonRowsTarget(target or "rows.db")


def says_yes_as_text(target: str | None) -> DedupingRows:
    adapter = make(target)
    adapter.dedupes_write_id = "yes"  # type: ignore[assignment]
    return adapter
