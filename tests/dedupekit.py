"""In-process targets that declare ``dedupes_write_id = True``, for the kit's dedupe proof:
one that keeps the promise (a unique key, ``INSERT … ON CONFLICT DO NOTHING``, as a
PostgreSQL table target does), and the ways real ones break it.

Each is a SQLite file of its own (``rows(write_id, body, status)``): every adapter made
for a path reaches the same rows, as the kit requires of ``healthy()``."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Observation,
    RejectedWrite,
    TargetRow,
    observe_rows,
)

Mode = Literal["ignore", "refuse", "check_then_insert", "client_cache"]


class DedupingRows:
    """A rows table that deduplicates by write_id, in one of four ways:

    ``ignore``
        a unique key and ``ON CONFLICT (write_id) DO NOTHING``: the promise kept.
    ``refuse``
        a unique key, and a request holding a write_id already there is refused whole
        (``RejectedWrite``, as an API answering 409 "duplicate" would be classified):
        never two rows, but the repeated write strands its record.
    ``check_then_insert``
        no unique key: the service looks the write_ids up, then inserts those it did not
        find, in two steps.  Calls one after the other never make two rows; two that
        overlap both find nothing.  The overlap is made certain for the kit's concurrent
        check: a call from a worker thread waits at ``race`` (a two-party barrier)
        between its lookup and its insert, so the kit's two threads both look before
        either inserts; calls from the main thread (every other check) do not wait.
    ``client_cache``
        no unique key: the *adapter* remembers what it wrote and skips it, so one
        adapter never writes a write_id twice, while another one (after a restart) does.
    """

    dedupes_write_id = True

    def __init__(self, path: str, mode: Mode = "ignore",
                 race: threading.Barrier | None = None) -> None:
        self.path, self.mode, self.race = path, mode, race
        self.written: set[str] = set()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        unique = "PRIMARY KEY" if self.mode in ("ignore", "refuse") else ""
        conn.execute(f"CREATE TABLE IF NOT EXISTS rows (write_id TEXT {unique}, body TEXT, "
                     "status TEXT DEFAULT 'new')")
        return conn

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        rows = [(w, json.dumps(r.model_dump())) for r, w in items]
        if self.mode == "client_cache":
            rows = [row for row in dict(rows).items() if row[0] not in self.written]
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise BeforeWriteError(f"not written: {exc}") from None
        try:
            if self.mode == "check_then_insert":
                rows = self._unseen(conn, rows)
            conn.execute("BEGIN IMMEDIATE")
            insert = "INSERT INTO rows (write_id, body) VALUES (?, ?)"
            if self.mode == "ignore":
                insert += " ON CONFLICT (write_id) DO NOTHING"
            conn.executemany(insert, rows)
            conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK")
            raise RejectedWrite("409: a write_id of this request is there already") from None
        except sqlite3.Error as exc:
            raise AmbiguousWriteError(f"may be written: {exc}") from None
        finally:
            conn.close()
        self.written.update(w for w, _ in rows)

    def _unseen(self, conn: sqlite3.Connection,
                rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
        marks = ",".join("?" * len(rows))
        seen = {w for (w,) in conn.execute(
            f"SELECT write_id FROM rows WHERE write_id IN ({marks})", [w for w, _ in rows])}
        if self.race is not None and threading.current_thread() is not threading.main_thread():
            self.race.wait()
        return list({w: body for w, body in rows if w not in seen}.items())

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.write_batch([(record, write_id)])

    def _rows(self, write_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            marks = ",".join("?" * len(write_ids))
            return conn.execute(f"SELECT write_id, body, status FROM rows WHERE write_id IN "
                                f"({marks}) ORDER BY rowid", list(write_ids)).fetchall()
        finally:
            conn.close()

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        return [TargetRow(w, json.loads(body), status) for w, body, status in
                self._rows(write_ids)]

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return self.read_back_many([write_id])

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        for write_id, _, status in self._rows(write_ids):
            found[write_id].append(status)
        return {w: observe_rows(s) for w, s in found.items()}


class ClaimsToDedupe(SyntheticTarget):
    """The synthetic sheet (a spreadsheet: it never deduplicates) declaring it does."""

    dedupes_write_id = True


class SaysYes(SyntheticTarget):
    """A declaration that is not a bool."""

    dedupes_write_id: Any = "yes"
