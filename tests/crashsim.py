"""In-process crash simulation for the model-based test (issue 8.5).

A dead process writes nothing more: :class:`KillableStore` refuses every operation once it
is killed (so no ``finally`` and no shielded record of an outcome reaches the store), and
:class:`Crash` is a ``BaseException`` that no ``except Exception`` in runner can swallow.
:class:`ModelTarget` is a real sheet whose next sends do what the test says, and which can
hold one send "on the wire" so the test can cancel the worker while it is out.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.invariants import DELETED_TABLE
from runner.io.engine.delivery import loop_dispatch_steps
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, Observation, TargetReadError, TargetRow


class Crash(BaseException):
    """The process died at a crash point (never caught by ``except Exception``)."""


class KillableStore:
    """The worker's store; once dead, every operation dies too."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dead = inner, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("aclose", "worker_lock"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise Crash("the process is dead")
            return attr(*args, **kwargs)
        return call

    def dispatch_steps(self) -> Any:
        # a dispatch run's steps come back through this wrapper, so they die with it too
        return loop_dispatch_steps(self)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ModelTarget:
    """A real sheet whose next sends do what the test says; counts sends that left."""

    def __init__(self, path: Path) -> None:
        self.sheet = SyntheticTarget(str(path))
        self.plan: list[str] = []
        self.left: Counter[str] = Counter()
        self.read_fails = self.status_fails = False
        self.hang: tuple[threading.Event, threading.Event, threading.Event, bool] | None = None

    def _land(self, record: CRMRecord, write_id: str) -> None:
        self.left[record.source_lead_id] += 1
        self.sheet.write(record, write_id)

    def write(self, record: CRMRecord, write_id: str) -> None:
        if self.hang is not None:
            (entered, release, done, lands), self.hang = self.hang, None
            entered.set()
            try:
                release.wait(30)
                if lands:
                    self._land(record, write_id)
                raise TimeoutError("the response never came")
            finally:
                done.set()
        what = self.plan.pop(0) if self.plan else "ok"
        if what == "before_write":
            raise BeforeWriteError("not sent")
        if what in ("timeout_no_write", "other_exception"):
            raise TimeoutError(what)
        self._land(record, write_id)
        if what == "write_then_timeout":
            raise TimeoutError("written, then timed out")

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        if self.read_fails:
            raise TargetReadError("readback failed")
        return self.sheet.read_back(write_id)

    def crm_change(self, key: str, delete: bool) -> None:
        """The CRM changes a row's status, or deletes it (kept aside for the auditor)."""
        with self.sheet._mutex:
            conn = self.sheet._connect()
            if not delete:
                conn.execute("UPDATE sheet SET status = 'contacted' WHERE source_lead_id = ?",
                             (key,))
                return
            conn.execute(f"CREATE TABLE IF NOT EXISTS {DELETED_TABLE} AS "
                         "SELECT * FROM sheet WHERE 0")
            conn.execute(f"INSERT INTO {DELETED_TABLE} SELECT * FROM sheet "
                         "WHERE source_lead_id = ?", (key,))
            conn.execute("DELETE FROM sheet WHERE source_lead_id = ?", (key,))

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        if self.status_fails:
            raise TargetReadError("status read failed")
        return self.sheet.observe_status(write_ids)


def read_store(db: Path, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Rows of a read-only query on the store, from outside; none if it has no such table."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
