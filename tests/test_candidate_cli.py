"""The candidate commands as a user runs them (C6): one JSON line each, exit codes,
one-line errors, refusals that change nothing (through ``main()`` in process), and the
crash fault (a real process: it is an ``os._exit``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import pg
from tests.helpers import (
    dump_store,
    event,
    last_json,
    run_cli,
    run_main,
    store_exists,
    write_json,
)
from tests.lifecycle_fixtures import add, at, cli, iso

NOW = f"--now={iso(at(0))}"


@pytest.fixture
def db(db_location: str) -> str:
    return db_location


def test_add_prints_the_candidate_with_the_t1_defaults(db: str) -> None:
    doc = cli(db, "candidate", "add", "--id", "c1", NOW)
    assert doc == {
        "id": "c1", "status": "discovered", "created_at": "2026-08-11T12:00:00.000000Z",
        "expires_at": "2026-08-11T12:30:00.000000Z",
        "analysis_deadline": "2026-08-11T12:30:00.000000Z", "quorum": 2, "analyses": 0,
        "analysts": [], "promotion_locked_at": None, "decision_id": None,
    }
    doc = cli(db, "candidate", "add", "--id", "c2", "--quorum", "3", "--ttl-minutes", "10",
              "--analysis-deadline", "2026-08-11T14:05:00+02:00", NOW)
    assert (doc["expires_at"], doc["analysis_deadline"], doc["quorum"]) == (
        "2026-08-11T12:10:00.000000Z", "2026-08-11T12:05:00.000000Z", 3)


def test_analyze_promote_list(db: str) -> None:
    cli(db, "candidate", "add", "--id", "c1", NOW)
    cli(db, "candidate", "add", "--id", "c2", NOW)
    assert cli(db, "candidate", "analyze", "--id", "c1", "--analyst", "analyst-a", NOW
               )["status"] == "analyzing"
    doc = cli(db, "candidate", "analyze", "--id", "c1", "--analyst", "analyst-b", NOW)
    assert (doc["analyses"], doc["analysts"]) == (2, ["analyst-a", "analyst-b"])
    doc = cli(db, "candidate", "promote", "--id", "c1", "--decision-id", "dec-1",
              f"--now={iso(at(1))}")
    assert (doc["status"], doc["decision_id"], doc["promotion_locked_at"]) == (
        "promoted", "dec-1", "2026-08-11T12:01:00.000000Z")
    listed = cli(db, "candidate", "list")
    assert [(c["id"], c["status"], c["analyses"], c["decision_id"]) for c in listed] == [
        ("c1", "promoted", 2, "dec-1"), ("c2", "discovered", 0, None)]
    for item in listed:
        assert {"id", "status", "expires_at", "analysis_deadline", "analyses",
                "decision_id"} <= set(item)


def test_sweep_prints_expired_and_reconciled(db: str) -> None:
    cli(db, "candidate", "add", "--id", "c1", NOW)
    assert cli(db, "sweep", f"--now={iso(at(30))}") == {"expired": 0, "reconciled": 0}
    assert cli(db, "sweep", f"--now={iso(at(30, seconds=1))}") == {"expired": 1,
                                                                    "reconciled": 0}


REFUSALS = [
    (("candidate", "add", "--id", "c1", NOW), "already exists"),
    (("candidate", "add", "--id", "c9", "--ttl-minutes", "10", "--analysis-deadline",
      "2026-08-11T12:10:00.000001Z", NOW), "T2"),
    (("candidate", "analyze", "--id", "nope", "--analyst", "a1", NOW), "no candidate 'nope'"),
    (("candidate", "analyze", "--id", "c1", "--analyst", "a1", NOW), "already analyzed"),
    (("candidate", "promote", "--id", "nope", "--decision-id", "d1", NOW), "no candidate"),
    (("candidate", "promote", "--id", "c1", "--decision-id", "d1", NOW), "1 of 2 analyses"),
    (("candidate", "promote", "--id", "c-old", "--decision-id", "d1", NOW), "it is expired"),
    (("candidate", "promote", "--id", "c-ready", "--decision-id", "d1",
      f"--now={iso(at(30, seconds=1))}"), "expired at"),
    (("candidate", "analyze", "--id", "", "--analyst", "a1", NOW), "non-empty"),
]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store built once through the CLI: c1 (one analysis), c-ready (quorum), c-old
    (expired by a sweep)."""
    work = tmp_path_factory.mktemp("seeded")
    work.chmod(0o700)
    db = work / "queue.db"
    cli(db, "candidate", "add", "--id", "c1", NOW)
    cli(db, "candidate", "analyze", "--id", "c1", "--analyst", "a1", NOW)
    cli(db, "candidate", "add", "--id", "c-ready", NOW)
    for analyst in ("a1", "a2"):
        cli(db, "candidate", "analyze", "--id", "c-ready", "--analyst", analyst, NOW)
    cli(db, "candidate", "add", "--id", "c-old", "--ttl-minutes", "1",
        f"--now={iso(at(-10))}")
    assert cli(db, "sweep", NOW) == {"expired": 1, "reconciled": 0}    # c-old
    assert not Path(f"{db}-wal").exists()   # checkpointed on close: the file is complete
    return db


def seed_in_process(db: str) -> None:
    """The same store as ``seeded``, built through the library (fast, for PostgreSQL,
    where a store cannot be copied as a file)."""
    from runner.io.stores import open_store

    async def go() -> None:
        async with await open_store(db) as store:
            await add(store, "c1", analysts=("a1",))
            await add(store, "c-ready", analysts=("a1", "a2"))
            await add(store, "c-old", created=at(-10), ttl_minutes=1)
            assert await store.sweep_candidates(at(0)) == {"expired": 1, "reconciled": 0}

    pg.run(go)


@pytest.mark.parametrize(("argv", "message"), REFUSALS)
def test_refused_operations_exit_65_with_one_line_and_change_nothing(
    db: str, request: pytest.FixtureRequest, argv: tuple[str, ...], message: str
) -> None:
    if pg.is_pg(db):
        seed_in_process(db)
    else:
        seeded: Path = request.getfixturevalue("seeded")
        shutil.copyfile(seeded, db)   # every process has closed it: no -wal left to copy
        Path(db).chmod(0o600)
    before = dump_store(db)
    proc = cli(db, *argv, ok=False)
    assert proc.returncode == 65, proc.stderr
    # every refusal answers on stdout too (issue 19 point 5)
    answer = json.loads(proc.stdout)
    assert answer["result"] == "refused" and answer["reason"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("runner: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr
    assert dump_store(db) == before


def test_refusals_in_json_log_format(db: str) -> None:
    cli(db, "candidate", "add", "--id", "c1", NOW)
    proc = cli(db, "candidate", "promote", "--id", "c1", "--decision-id", "d1", NOW,
               "--log-format", "json", ok=False)
    assert proc.returncode == 65
    line = json.loads(proc.stderr)
    assert (line["level"], line["reason"]) == ("error", "no_quorum")


def test_a_t2_violation_does_not_even_create_the_store(missing_location: str) -> None:
    proc = cli(missing_location, "candidate", "add", "--id", "c1", "--analysis-deadline",
               "2026-08-11T13:00:00Z", NOW, ok=False)
    assert proc.returncode == 65 and "analysis_deadline" in proc.stderr
    assert not store_exists(missing_location)


@pytest.mark.parametrize("argv", [
    ("candidate", "add", "--id", "c1", "--quorum", "0"),
    ("candidate", "add", "--id", "c1", "--ttl-minutes", "-5"),
    ("candidate", "add", "--id", "c1", "--analysis-deadline", "tomorrow"),
    ("candidate", "add", "--id", "c1", "--now", "2026-08-11T12:00:00"),   # no timezone
    ("candidate", "analyze", "--id", "c1"),                               # no --analyst
    ("candidate", "promote", "--id", "c1", "--decision-id", "d", "--fault", "other"),
    ("candidate", "remove", "--id", "c1"),
])
def test_usage_errors_exit_2(missing_location: str, argv: tuple[str, ...]) -> None:
    proc = cli(missing_location, *argv, ok=False)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not store_exists(missing_location)


@pytest.mark.parametrize("argv", [
    ("candidate", "analyze", "--id", "c1", "--analyst", "a1"),
    ("candidate", "promote", "--id", "c1", "--decision-id", "d1"),
    ("candidate", "list"),
    ("sweep",),
])
def test_commands_other_than_add_never_create_a_store(missing_location: str,
                                                      argv: tuple[str, ...]) -> None:
    proc = cli(missing_location, *argv, ok=False)
    assert proc.returncode == 66 and "no store" in proc.stderr
    assert not store_exists(missing_location)


def test_candidates_work_with_and_without_a_pinned_scope(
    workdir: Path, scope_file: Path, new_location: Callable[[str], str]
) -> None:
    plain, scoped = new_location("plain"), new_location("scoped")
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", scoped, "--scope", scope_file, "--record", rec
                   ).returncode == 0
    for db in (plain, scoped):
        cli(db, "candidate", "add", "--id", "c1", NOW)
        assert cli(db, "sweep", f"--now={iso(at(31))}") == {"expired": 1, "reconciled": 0}
    status = last_json(run_main("status", "--db", scoped, "--scope", scope_file).stdout)
    assert status["counts"]["prepared"] == 1 and status["lifecycle"]["counts"]["expired"] == 1


# -- M2 through the real CLI: a promotion stuck by a crash ---------------------------------


def stuck(db: str, fault: str) -> None:
    cli(db, "candidate", "add", "--id", "c1", NOW)
    for analyst in ("a1", "a2"):
        cli(db, "candidate", "analyze", "--id", "c1", "--analyst", analyst, NOW)
    # the crash is an os._exit: a real process
    proc = run_cli("candidate", "promote", "--id", "c1", "--decision-id", "dec-1",
                   f"--now={iso(at(5))}", "--fault", fault, "--db", db)
    assert proc.returncode == 73, proc.stderr
    assert proc.stdout == "" and "simulated crash" in proc.stderr


def test_crash_before_decision_leaves_it_promoting_then_the_sweep_rejects_it(db: str) -> None:
    stuck(db, "crash-before-decision")
    [c] = cli(db, "candidate", "list")
    assert (c["status"], c["promotion_locked_at"], c["decision_id"]) == (
        "promoting", "2026-08-11T12:05:00.000000Z", None)
    assert cli(db, "sweep", f"--now={iso(at(5, seconds=59))}") == {"expired": 0,
                                                                    "reconciled": 0}
    assert cli(db, "candidate", "list")[0]["status"] == "promoting"
    assert cli(db, "sweep", f"--now={iso(at(6, seconds=1))}") == {"expired": 0,
                                                                   "reconciled": 1}
    assert cli(db, "candidate", "list")[0]["status"] == "rejected"


def test_crash_after_decision_then_the_sweep_promotes_it(db: str) -> None:
    stuck(db, "crash-after-decision")
    assert cli(db, "candidate", "list")[0]["decision_id"] == "dec-1"
    assert cli(db, "sweep", f"--now={iso(at(6, seconds=1))}") == {"expired": 0,
                                                                   "reconciled": 1}
    [c] = cli(db, "candidate", "list")
    assert (c["status"], c["decision_id"]) == ("promoted", "dec-1")


def test_a_stuck_promotion_cannot_be_promoted_again_by_hand(db: str) -> None:
    stuck(db, "crash-before-decision")
    proc = cli(db, "candidate", "promote", "--id", "c1", "--decision-id", "dec-2",
               f"--now={iso(at(5, seconds=30))}", ok=False)
    assert proc.returncode == 65 and "promoting" in proc.stderr


# -- status ------------------------------------------------------------------------------


def test_status_shows_the_lifecycle_block(db: str) -> None:
    cli(db, "candidate", "add", "--id", "c1", NOW)
    cli(db, "candidate", "add", "--id", "c2", "--ttl-minutes", "60", NOW)
    before = last_json(run_main("status", "--db", db).stdout)["lifecycle"]
    assert before["last_sweep"] is None
    cli(db, "sweep", f"--now={iso(at(31))}")
    doc = last_json(run_main("status", "--db", db).stdout)
    # appended after the lead blocks (the pipeline blocks follow it)
    assert list(doc)[list(doc).index("poll_health") + 1] == "lifecycle"
    assert doc["lifecycle"] == {
        "counts": {"discovered": 1, "analyzing": 0, "promoting": 0, "promoted": 0,
                   "rejected": 0, "expired": 1},
        "schedule": {"name": "Candidate Lifecycle Sweep", "function": "sweepCandidates",
                     "schedule": "*/5 * * * *", "timezone": "UTC", "interval_seconds": 300,
                     "mode": "shadow"},
        "last_sweep": {"function": "sweepCandidates", "at": "2026-08-11T12:31:00.000000Z",
                       "result": {"expired": 1, "reconciled": 0}},
    }
    assert doc["outbox"]["by_kind"] == {"candidate_changed": 3}
