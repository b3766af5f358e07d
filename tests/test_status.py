"""``status`` (L13): the JSON shape, read-only, no lock, works while others write."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from runner.states import LeadState
from tests.helpers import SCOPE, dump_db, event, last_json, run_cli, write_json


@pytest.fixture
def db(workdir: Path, scope_file: Path) -> Path:
    db = workdir / "queue.db"
    for i in range(3):
        rec = write_json(workdir / f"e{i}.json", event(i))
        assert run_cli("accept", "--db", db, "--scope", scope_file, "--record", rec
                       ).returncode == 0
    return db


def test_status_shape(db: Path, scope_file: Path) -> None:
    proc = run_cli("status", "--db", db, "--scope", scope_file)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    doc = json.loads(proc.stdout)
    assert list(doc) == ["scope", "schema_version", "counts", "records", "outbox", "poll_health",
                         "lifecycle", "pipeline", "funnel"]
    assert doc["scope"] == SCOPE
    assert doc["schema_version"] >= 1
    assert doc["counts"] == {s.value: (3 if s is LeadState.PREPARED else 0) for s in LeadState}
    assert [set(r) for r in doc["records"]] == [{
        "source_lead_id", "state", "write_id", "attempts", "reconcile_attempts", "snapshot",
        "last_polled_at"}] * 3
    assert doc["records"][0]["state"] == "prepared" and doc["records"][0]["attempts"] == 0
    assert doc["outbox"] == {"count": 3, "last_seq": 3, "by_kind": {"accepted": 3}}
    assert doc["poll_health"] == []
    assert doc["pipeline"]["backlog"]["stages"]["raw_ingestion"] == {"lead-outbox@1": 3}
    assert doc["pipeline"]["levels"] == {"D1": 0, "D2": 0, "D3": 0, "D4": 0}
    assert doc["funnel"] == {}


def test_status_changes_nothing(db: Path, scope_file: Path) -> None:
    before = dump_db(db)
    assert run_cli("status", "--db", db).returncode == 0
    assert run_cli("status", "--db", db, "--scope", scope_file).returncode == 0
    assert dump_db(db) == before


def test_status_while_another_process_holds_the_write_lock(db: Path) -> None:
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO meta VALUES ('in-progress', 'x')")
        proc = run_cli("status", "--db", db, timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert sum(last_json(proc.stdout)["counts"].values()) == 3
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_status_of_a_missing_store_is_an_error_and_creates_nothing(workdir: Path) -> None:
    proc = run_cli("status", "--db", workdir / "nothing.db")
    assert proc.returncode == 66 and "no store" in proc.stderr
    assert not (workdir / "nothing.db").exists()


def test_status_with_another_scope_exits_78(db: Path, workdir: Path) -> None:
    other = write_json(workdir / "other.json", {**SCOPE, "tenant_id": "tenant-2"})
    assert run_cli("status", "--db", db, "--scope", other).returncode == 78


def test_status_json_log_format_errors(workdir: Path) -> None:
    proc = run_cli("status", "--db", workdir / "nothing.db", "--log-format", "json")
    line = json.loads(proc.stderr.strip())
    assert line["level"] == "error" and line["reason"] == "store_not_found"
