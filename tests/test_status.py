"""``status`` (L13): the JSON shape, read-only, no lock, works while others write."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from datetime import UTC, datetime
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
    status_records,
    store_exists,
    worker_records,
    write_json,
)
from tests.pipeline_fixtures import query

RECORD_FIELDS = {"source_lead_id", "state", "write_id", "attempts", "reconcile_attempts",
                 "snapshot", "last_polled_at", "contact_alias_present", "last_error",
                 "last_failure"}


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
    assert list(doc) == ["scope", "schema_version", "counts", "retries", "replication",
                         "marks", "uncertain",
                         "outbox", "poll_health", "lifecycle", "pipeline", "funnel",
                         "decisions"]
    assert doc["uncertain"] == {"total": 0, "truncated": False, "records": []}
    marks = doc["marks"]  # nothing sent yet: the first epoch, no batch, no rewind
    assert (len(marks["store_id"]), marks["mark"], marks["rewind"], marks["adopting"]) == (
        32, "1.0", None, None)
    assert doc["retries"] == {"waiting": 0, "next_attempt_at": None, "rejected": 0}
    assert doc["scope"] == SCOPE
    assert doc["schema_version"] >= 1
    assert doc["counts"] == {s.value: (3 if s is LeadState.PREPARED else 0) for s in LeadState}
    records = status_records(db)
    assert [set(r) for r in records] == [RECORD_FIELDS] * 3
    assert records[0]["state"] == "prepared" and records[0]["attempts"] == 0
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


# -- a status that stays small (issue 21) ---------------------------------------------

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _arrange(db: str, n: int, uncertain: list[int]) -> None:
    """``n`` records accepted in order (``lead-0`` first); those in ``uncertain`` made
    uncertain in that order (in flight, then uncertain: the legal path)."""
    from runner.io.stores import open_store
    from runner.leads.intake import prepare
    from runner.leads.models import WriteId, validate_scope
    from runner.storedata import AcceptItem

    async def go() -> None:
        scope = validate_scope(SCOPE)
        async with await open_store(db, scope=scope, create=True) as store:
            for start in range(0, n, 500):
                items = [AcceptItem(*prepare(event(i), scope), WriteId(f"w-{i:05d}"))
                         for i in range(start, min(n, start + 500))]
                await store.accept_many(items, NOW)
            for i in uncertain:  # one at a time: the order they became uncertain
                w = WriteId(f"w-{i:05d}")
                await store.finish_and_mark_batch([], [w], NOW)
                await store.finish_and_mark_batch([(w, LeadState.UNCERTAIN)], [], NOW)

    anyio.run(go)


def test_default_status_is_bounded_with_a_truncated_flag(db_location: str) -> None:
    # more uncertain records than the bound: the oldest 100 shown, the total, truncated
    _arrange(db_location, 130, list(range(120)))
    proc = run_main("status", "--db", db_location)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    block = doc["uncertain"]
    assert (block["total"], block["truncated"], len(block["records"])) == (120, True, 100)
    assert doc["counts"]["uncertain"] == 120 and doc["counts"]["prepared"] == 10
    assert [r["source_lead_id"] for r in block["records"]] == [f"lead-{i}" for i in range(100)]
    assert all(set(r) == RECORD_FIELDS and r["state"] == "uncertain"
               for r in block["records"])
    # no per-record list beside it: the document's size does not grow with the store
    assert "records" not in doc
    # a bound of 120 or more shows them all, untruncated; 0 shows none
    whole = json.loads(run_main("status", "--db", db_location, "--shown", "120").stdout)
    assert (len(whole["uncertain"]["records"]), whole["uncertain"]["truncated"]) == (120, False)
    none = json.loads(run_main("status", "--db", db_location, "--shown", "0").stdout)
    assert none["uncertain"] == {"total": 120, "truncated": True, "records": []}


def test_oldest_uncertain_records_come_first_in_accept_order(db_location: str) -> None:
    # made uncertain newest first: the list still starts with the oldest (first accepted)
    _arrange(db_location, 8, [6, 5, 3, 1])
    doc = json.loads(run_main("status", "--db", db_location, "--shown", "3").stdout)
    assert [r["source_lead_id"] for r in doc["uncertain"]["records"]] == [
        "lead-1", "lead-3", "lead-5"]
    assert (doc["uncertain"]["total"], doc["uncertain"]["truncated"]) == (4, True)
    only = status_records(db_location, "uncertain")
    assert [r["source_lead_id"] for r in only] == ["lead-1", "lead-3", "lead-5", "lead-6"]


def test_records_stream_as_ndjson_equal_to_the_whole_store(db_location: str) -> None:
    # more than one page (1,000 a page): every record once, in accept order
    n = 2345
    _arrange(db_location, n, [7, 2000])
    proc = run_main("status", "--db", db_location, "--records")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == n and proc.stdout.endswith("\n")
    records = [json.loads(line) for line in lines]
    assert [r["source_lead_id"] for r in records] == [f"lead-{i}" for i in range(n)]
    assert all(set(r) == RECORD_FIELDS for r in records)
    assert [r["source_lead_id"] for r in records if r["state"] == "uncertain"] == [
        "lead-7", "lead-2000"]
    # "all" is the same answer; a state lists that state's records only
    assert status_records(db_location, "all") == records
    assert status_records(db_location, "prepared") == [
        r for r in records if r["state"] == "prepared"]
    assert status_records(db_location, "confirmed") == []
    # the library gives the same documents, and the store read directly agrees
    from runner import DurableWorker

    async def library() -> tuple[list[dict[str, object]], list[str]]:
        async with DurableWorker(db_location, SCOPE) as worker:
            listed = await worker_records(worker)
            ids = [row.write_id async for row in worker.store.iter_records(page=7)]
            uncertain = [r["source_lead_id"] async for r in worker.records("uncertain")]
            assert uncertain == ["lead-7", "lead-2000"]
            return listed, ids

    listed, ids = anyio.run(library)
    assert listed == records
    assert ids == [r["write_id"] for r in records]


def test_kept_counts_equal_the_rows_they_count(db_location: str) -> None:
    _arrange(db_location, 40, [3, 9, 27])
    doc = json.loads(run_main("status", "--db", db_location).stdout)
    records = status_records(db_location)
    by_state: dict[str, int] = {}
    for r in records:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
    assert {k: v for k, v in doc["counts"].items() if v} == by_state
    events = {str(kind): int(n) for kind, n in query(
        db_location, "SELECT kind, count(*) FROM outbox GROUP BY kind")}
    assert doc["outbox"]["by_kind"] == events == {"accepted": 40, "state_changed": 6}
    assert doc["outbox"]["count"] == sum(events.values())


@pytest.mark.parametrize(("argv", "said"), [
    (["--records", "bogus"], "'bogus' is not a record state; use all or one of: prepared"),
    (["--records", ""], "'' is not a record state"),
    (["--records", "UNCERTAIN"], "'UNCERTAIN' is not a record state"),
    (["--shown", "-1"], "'-1' must be between 0 and 10000"),
    (["--shown", "10001"], "'10001' must be between 0 and 10000"),
    (["--shown", "many"], "'many' is not a whole number"),
])
def test_status_options_with_bad_input_are_a_clear_usage_error(
    db: str, argv: list[str], said: str
) -> None:
    proc = run_main("status", "--db", db, *argv)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert said in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line, no usage dump


def test_library_status_and_records_refuse_bad_input(db_location: str) -> None:
    from runner import DurableWorker
    from runner.errors import UsageError

    _arrange(db_location, 3, [1])

    async def go() -> None:
        async with DurableWorker(db_location, SCOPE) as worker:
            for shown in (-1, 10_001, True):
                with pytest.raises(UsageError, match="shown must be a whole number"):
                    await worker.status(shown=shown)
            with pytest.raises(UsageError, match="'nope' is not a record state"):
                worker.records("nope")
            doc = await worker.status(shown=1)
            assert doc["uncertain"]["total"] == 1 and not doc["uncertain"]["truncated"]

    anyio.run(go)
