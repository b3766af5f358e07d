"""The pipeline commands as a new user runs them (issue 7 points 2, 4, 5, 8): ``worker``,
``job``, ``backlog``, ``start --workers``, hot reconfiguration, progress, privacy."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runner.pipeline.progress import Progress
from tests.helpers import CANARY, SCOPE, Child, event, last_json, run_main, write_json
from tests.pipeline_fixtures import dump_pipeline

pytestmark = pytest.mark.timeout(90)


def accept(db: str, scope_file: Path, workdir: Path, first: int, n: int, **kw: Any) -> None:
    lines = "".join(json.dumps(event(i, **kw)) + "\n" for i in range(first, first + n))
    records = workdir / f"records-{first}.ndjson"
    records.write_text(lines, encoding="utf-8")
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--records", records)
    assert proc.returncode == 0, proc.stderr


def status(db: str) -> dict[str, Any]:
    proc = run_main("status", "--db", db)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_status(db: str, predicate: Any, what: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not predicate(doc := status(db)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {doc}"
        time.sleep(0.05)
    return doc


@pytest.fixture
def db(db_location: str, workdir: Path, scope_file: Path) -> str:
    accept(db_location, scope_file, workdir, 0, 3)
    return db_location


def test_workers_jobs_and_backlog_on_the_command_line(db: str) -> None:
    before = run_main("backlog", "--db", db)
    assert before.returncode == 0
    assert json.loads(before.stdout) == {"pending_total": 3, "stages": {
        "raw_ingestion": {"lead-outbox@1": 3}, "core_processing": {"lead-facts@1": 0},
        "generic_materialization": {"lead-current@1": 0},
        "domain_projection": {"lead-funnel@1": 0}}}
    worker = run_main("worker", "raw-retriever", "--db", db, "--cycles", "2",
                     "--batch-size", "2")
    assert worker.returncode == 0, worker.stderr
    lines = [json.loads(line) for line in worker.stdout.splitlines()]
    assert [(c["cycle"], c["claimed"]) for c in lines] == [(1, 2), (2, 1)]
    assert lines[0]["outcomes"] == {"ingested": 2, "already_there": 0, "skipped": 0}
    core = run_main("worker", "core-processor", "--db", db, "--cycles", "1")
    assert last_json(core.stdout) == {"worker": "core-processor", "cycle": 1, "claimed": 3,
                                      "outcomes": {"output": 3}, "refused": False}
    job = run_main("job", "replay-generic-materialization", "--db", db)
    assert job.returncode == 0, job.stderr
    assert last_json(job.stdout) == {
        "job": "replay-generic-materialization", "force": False, "requeued": 0,
        "processed": 3, "outcomes": {"output": 3}, "refused": False, "pending": 0}
    progress = [json.loads(line) for line in job.stderr.splitlines() if line.startswith("{")]
    assert progress[0] == {"job": "replay-generic-materialization", "done": 0, "total": 3,
                           "pending": 3}
    assert progress[-1] == {"job": "replay-generic-materialization", "done": 3,
                            "total": 3, "pending": 0}
    forced = run_main("job", "replay-core", "--db", db, "--force")
    assert last_json(forced.stdout)["requeued"] == 3
    after = json.loads(run_main("backlog", "--db", db).stdout)
    assert after["pending_total"] == 3  # D3 rows wait for the domain projector
    assert after["stages"]["domain_projection"] == {"lead-funnel@1": 3}


def test_bad_names_and_missing_stores_are_refused(workdir: Path) -> None:
    assert run_main("worker", "nope", "--db", workdir / "q.db").returncode == 2
    assert run_main("job", "replay-core", "--db", workdir / "q.db").returncode == 66
    assert run_main("backlog", "--db", workdir / "q.db").returncode == 66
    assert not (workdir / "q.db").exists()
    assert run_main("worker", "core-processor", "--db", workdir / "q.db", "--plugin",
                   "no.such.module").returncode == 2


def test_progress_is_a_bar_on_a_terminal_and_json_lines_otherwise() -> None:
    out = io.StringIO()
    bar = Progress("replay-core", out, tty=True)
    bar.update(50, 100, 50, final=True)
    bar.close()
    assert "\rreplay-core [###############---------------] 50/100" in out.getvalue()
    lines = io.StringIO()
    Progress("replay-core", lines, tty=False).update(1, 2, 1)
    assert json.loads(lines.getvalue()) == {"job": "replay-core", "done": 1, "total": 2,
                                            "pending": 1}


def test_the_raw_retriever_takes_hot_reconfiguration(
    db: str, workdir: Path, scope_file: Path
) -> None:
    config = write_json(workdir / "retriever.json", {"batch_size": 2})
    child = Child("worker", "raw-retriever", "--db", db, "--retriever-config", config,
                  "--poll-interval", "0.05")
    try:
        def claimed(c: Child) -> int:
            return sum(json.loads(line)["claimed"] for line in c.out)

        child.wait_for(lambda c: claimed(c) == 3, what="3 events read")
        assert max(json.loads(line)["claimed"] for line in child.out) == 2
        write_json(config, {"batch_size": 5, "kinds": ["state_changed"]})
        doc = wait_status(db, lambda d: d["pipeline"]["workers"]["raw-retriever"][
            "effective"]["batch_size"] == 5, "the edit to take effect")
        view = doc["pipeline"]["workers"]["raw-retriever"]
        assert view["desired"] == {"batch_size": 5, "kinds": ["state_changed"]}
        assert view["error"] is None
        seen = len(child.out)
        accept(db, scope_file, workdir, 10, 4)  # 4 "accepted" events: not tailed now
        child.wait_for(lambda c: claimed(c) == 7, what="4 more events read")
        later = [json.loads(line) for line in child.out[seen:]]
        assert sum(c["outcomes"].get("skipped", 0) for c in later) == 4
        assert sum(c["outcomes"].get("ingested", 0) for c in later) == 0

        config.write_text("{not json")  # invalid: the effective config stays
        doc = wait_status(db, lambda d: d["pipeline"]["workers"]["raw-retriever"]["error"],
                          "the error to show")
        view = doc["pipeline"]["workers"]["raw-retriever"]
        assert view["effective"]["batch_size"] == 5 and view["desired"] is None
        assert "not valid JSON" in view["error"]
        write_json(config, {"batch_size": 0})
        doc = wait_status(db, lambda d: d["pipeline"]["workers"]["raw-retriever"][
            "desired"] == {"batch_size": 0}, "the invalid desired config")
        view = doc["pipeline"]["workers"]["raw-retriever"]
        assert "batch_size" in view["error"] and view["effective"]["batch_size"] == 5
        assert view["effective"]["kinds"] == ["state_changed"]
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()


def test_start_runs_the_pipeline_workers_as_background_tasks(
    db: str, workdir: Path, scope_file: Path
) -> None:
    child = Child("start", "--db", db, "--scope", scope_file, "--target",
                  workdir / "target.db", "--interval", "0.2",
                  "--workers", "raw-retriever,core-processor,generic-materializer,"
                               "domain-projector")
    try:
        doc = wait_status(db, lambda d: d["funnel"] == {SCOPE["form_id"]: {"new": 3}},
                          "the funnel to fill", timeout=60)
        assert doc["counts"]["confirmed"] == 3
        child.signal(signal.SIGINT)
        assert child.finish() == 0
    finally:
        child.kill()
    assert run_main("start", "--db", db, "--scope", scope_file, "--target",
                    workdir / "target.db", "--workers", "bogus", guard=False).returncode == 2


def test_pipeline_levels_never_hold_a_contact_field(
    db_location: str, workdir: Path, scope_file: Path
) -> None:
    db = db_location
    accept(db, scope_file, workdir, 0, 3, contact_alias=CANARY)
    assert run_main("once", "--db", db, "--scope", scope_file, "--target",
                   workdir / "t.db").returncode == 0
    outputs = []
    for args in (("job", "backfill"), ("job", "replay-core"),
                 ("job", "replay-generic-materialization"),
                 ("job", "replay-domain-projection"), ("backlog",), ("status",)):
        proc = run_main(*args, "--db", db)
        assert proc.returncode == 0, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    assert all(CANARY not in text for text in outputs)
    dump = "\n".join(dump_pipeline(db))
    assert "lead-1" in dump and CANARY not in dump
    assert status(db)["funnel"] == {SCOPE["form_id"]: {"new": 3}}
