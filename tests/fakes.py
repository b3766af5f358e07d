"""In-process test adapters: a scripted wrapper around the real synthetic target."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, Observation, TargetRow

BEHAVIOURS = ("ok", "before_write", "write_then_timeout", "timeout_no_write", "other_exception")


class ScriptedAdapter:
    """Each write does what ``script(write_id)`` says; the sheet is a real SQLite file."""

    def __init__(self, path: Path, script: Callable[[str], str] | None = None) -> None:
        self.sheet = SyntheticTarget(str(path))
        self.script = script or (lambda _w: "ok")
        self.writes: list[str] = []
        self.read_fails = False

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.writes.append(write_id)
        what = self.script(write_id)
        if what == "before_write":
            raise BeforeWriteError("scripted: not sent")
        if what == "timeout_no_write":
            raise TimeoutError("scripted: timed out before anything was written")
        if what == "other_exception":
            raise RuntimeError("scripted: something odd")
        self.sheet.write(record, write_id)
        if what == "write_then_timeout":
            raise TimeoutError("scripted: written, then timed out")

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        if self.read_fails:
            raise ConnectionError("scripted: read failed")
        return self.sheet.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        return self.sheet.observe_status(write_ids)


def sheet_rows(path: Path) -> list[tuple]:
    import sqlite3

    if not path.exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT row_id, write_id, tenant, source, source_lead_id, is_test, contact_alias,"
            " status FROM sheet ORDER BY row_id").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
