"""``status`` (L13): the JSON shape, read-only, no lock, works while others write."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import anyio
import pytest

from runner.leads.states import LeadState
from tests import pg
from tests.helpers import (
    SCOPE,
    dump_store,
    event,
    last_json,
    run_main,
    store_exists,
    write_json,
)


@pytest.fixture
def db(db_location: str, workdir: Path, scope_file: Path) -> str:
    db = db_location
    for i in range(3):
        rec = write_json(workdir / f"e{i}.json", event(i))
        assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                       ).returncode == 0
    return db


def test_status_shape(db: str, scope_file: Path) -> None:
    proc = run_main("status", "--db", db, "--scope", scope_file)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    doc = json.loads(proc.stdout)
    assert list(doc) == ["scope", "schema_version", "counts", "retries", "records", "outbox",
                         "poll_health", "lifecycle", "pipeline", "funnel", "decisions"]
    assert doc["retries"] == {"waiting": 0, "next_attempt_at": None, "rejected": 0}
    assert doc["scope"] == SCOPE
    assert doc["schema_version"] >= 1
    assert doc["counts"] == {s.value: (3 if s is LeadState.PREPARED else 0) for s in LeadState}
    assert [set(r) for r in doc["records"]] == [{
        "source_lead_id", "state", "write_id", "attempts", "reconcile_attempts", "snapshot",
        "last_polled_at", "contact_alias_present", "last_error"}] * 3
    assert doc["records"][0]["state"] == "prepared" and doc["records"][0]["attempts"] == 0
    assert doc["outbox"] == {"count": 3, "last_seq": 3, "by_kind": {"accepted": 3}}
    assert doc["poll_health"] == []
    assert doc["pipeline"]["backlog"]["stages"]["raw_ingestion"] == {"lead-outbox@1": 3}
    assert doc["pipeline"]["levels"] == {"D1": 0, "D2": 0, "D3": 0, "D4": 0}
    assert doc["funnel"] == {}


def test_status_changes_nothing(db: str, scope_file: Path) -> None:
    before = dump_store(db)
    assert run_main("status", "--db", db).returncode == 0
    assert run_main("status", "--db", db, "--scope", scope_file).returncode == 0
    assert dump_store(db) == before


def test_status_while_another_process_holds_the_write_lock(db: str) -> None:
    if pg.is_pg(db):
        _status_while_a_pg_writer_holds_locks(db)
        return
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO meta VALUES ('in-progress', 'x')")
        proc = run_main("status", "--db", db, timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert sum(last_json(proc.stdout)["counts"].values()) == 3
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def _status_while_a_pg_writer_holds_locks(db: str) -> None:
    """A transaction that holds every lead row and the outbox counter (what a writer
    holds) does not block a status read."""
    import asyncpg

    schema = f'"{pg.schema_of(db)}"'

    async def scenario() -> subprocess.CompletedProcess[str]:
        writer = await asyncpg.connect(pg.dsn())
        try:
            async with writer.transaction():
                await writer.execute(f"SELECT * FROM {schema}.leads FOR UPDATE")
                await writer.execute(f"SELECT * FROM {schema}.outbox_counter FOR UPDATE")
                await writer.execute(f"INSERT INTO {schema}.meta VALUES ('in-progress', 'x')")
                proc = await anyio.to_thread.run_sync(
                    lambda: run_main("status", "--db", db, timeout=20))
                raise _Rollback(proc)
        except _Rollback as done:
            return done.proc
        finally:
            await writer.close()

    proc = pg.run(scenario)
    assert proc.returncode == 0, proc.stderr
    assert sum(last_json(proc.stdout)["counts"].values()) == 3


class _Rollback(Exception):
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.proc = proc


def test_status_of_a_missing_store_is_an_error_and_creates_nothing(missing_location: str) -> None:
    proc = run_main("status", "--db", missing_location)
    assert proc.returncode == 66 and "no " in proc.stderr and "store" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not store_exists(missing_location)


def test_status_with_another_scope_exits_78(db: str, workdir: Path) -> None:
    other = write_json(workdir / "other.json", {**SCOPE, "tenant_id": "tenant-2"})
    assert run_main("status", "--db", db, "--scope", other).returncode == 78


def test_status_json_log_format_errors(missing_location: str) -> None:
    proc = run_main("status", "--db", missing_location, "--log-format", "json")
    line = json.loads(proc.stderr.strip())
    assert line["level"] == "error" and line["reason"] == "store_not_found"


def test_status_into_a_closed_pipe_stops_quietly(db: Path) -> None:
    import subprocess
    import sys

    from tests.helpers import RUN

    reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(10)"],
                              stdin=subprocess.PIPE)
    assert reader.stdin is not None
    proc = subprocess.run([sys.executable, RUN, "status", "--db", str(db)],
                          stdout=reader.stdin, stderr=subprocess.PIPE, timeout=60, check=False)
    reader.stdin.close()
    reader.wait(timeout=30)
    assert proc.returncode in (0, 141)  # 0 if it all fitted in the pipe before it closed
    assert b"Traceback" not in proc.stderr and b"internal error" not in proc.stderr
