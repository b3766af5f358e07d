"""Status polling and observations with real processes (issue 4 points 3, 4, 6d-h)."""

from __future__ import annotations

import sqlite3

import pytest

from tests.fakes import sheet_rows
from tests.helpers import CliStore, event, run_main, write_json


def set_target_status(store: CliStore, key: str, status: str) -> None:
    conn = sqlite3.connect(store.target)
    conn.execute("UPDATE sheet SET status = ? WHERE source_lead_id = ?", (status, key))
    conn.commit()
    conn.close()


@pytest.fixture
def env(cli_store: CliStore) -> CliStore:
    return cli_store


def kinds(doc: dict) -> dict[str, int]:
    return doc["outbox"]["by_kind"]


def test_a_separate_start_process_sees_a_target_status_change(env: CliStore) -> None:
    env.confirmed(2)
    env.cli("poll-status")  # first observation: {"status": "new"}
    before = kinds(env.status()).get("status_changed", 0)
    set_target_status(env, "lead-1", "qualified")  # changed in the target, runner not running
    out = env.cli("start", "--cycles", "1")
    assert out["polled"] == 2
    doc = env.status()
    assert kinds(doc)["status_changed"] == before + 1
    recs = env.records()
    assert recs["lead-1"]["snapshot"] == {"status": "qualified"}
    assert recs["lead-0"]["snapshot"] == {"status": "new"}


def test_polling_is_fair_every_record_once_before_any_twice(env: CliStore) -> None:
    env.confirmed(250)
    times = ["2026-12-01T00:00:01Z", "2026-12-01T00:00:02Z", "2026-12-01T00:00:03Z"]
    for at in times:
        assert env.cli("poll-status", "--poll-limit", "100", "--now", at)["polled"] == 100
    recs = env.all_records()
    assert len(recs) == 250
    assert all(r["last_polled_at"] is not None for r in recs)  # every record once
    by_time = {}
    for r in recs:
        by_time.setdefault(r["last_polled_at"][:19], []).append(r["source_lead_id"])
    # pass 3 took the 50 never polled, then the 50 polled longest ago (pass 1's first 50)
    assert sorted(len(v) for v in by_time.values()) == [50, 100, 100]
    third = set(by_time["2026-12-01T00:00:03"])
    assert third == {f"lead-{i}" for i in range(200, 250)} | {f"lead-{i}" for i in range(50)}


def test_an_unchanged_poll_writes_no_event(env: CliStore) -> None:
    env.confirmed(3)
    first = env.cli("poll-status")
    assert (first["polled"], first["changed"]) == (3, 3)  # first snapshot of each
    count = env.status()["outbox"]["count"]
    second = env.cli("poll-status")
    assert (second["changed"], second["unchanged"]) == (0, 3)
    doc = env.status()
    assert doc["outbox"]["count"] == count
    assert all(r["last_polled_at"] for r in env.all_records())


def test_read_errors_over_three_runs_make_one_health_event(env: CliStore) -> None:
    env.confirmed(2)
    env.cli("poll-status")
    snapshots = [r["snapshot"] for r in env.all_records()]
    for _ in range(3):
        out = env.cli("poll-status", "--fault", "read-error", code=74)  # every read failed
        assert (out["failed"], out["changed"], out["missing"]) == (2, 0, 0)
    doc = env.status()
    assert kinds(doc)["poll_health"] == 1
    records = env.all_records()
    assert [r["snapshot"] for r in records] == snapshots  # kept, never "deleted"
    assert {r["state"] for r in records} == {"confirmed"}
    assert doc["poll_health"][0]["open"] and doc["poll_health"][0]["passes"] == 3
    env.cli("poll-status")  # recovers: the run is closed
    assert not env.status()["poll_health"][0]["open"]
    env.cli("poll-status", "--fault", "read-error", code=74)  # a new run: a new event
    assert kinds(env.status())["poll_health"] == 2


def test_an_explicit_missing_is_never_sent_again(env: CliStore) -> None:
    env.confirmed(2)
    conn = sqlite3.connect(env.target)
    conn.execute("DELETE FROM sheet WHERE source_lead_id = 'lead-1'")
    conn.commit()
    conn.close()
    out = env.cli("poll-status")
    assert out["missing"] == 1
    for _ in range(3):
        env.cli("once")
    recs = env.records()
    assert recs["lead-1"]["state"] == "confirmed_then_missing"
    assert recs["lead-1"]["snapshot"] == {"missing": True} and recs["lead-1"]["attempts"] == 1
    assert [r[4] for r in sheet_rows(env.target)] == ["lead-0"]


def test_ambiguous_status_read_is_a_failure_not_a_deletion(env: CliStore) -> None:
    env.confirmed(1)
    conn = sqlite3.connect(env.target)
    conn.execute("INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, status)"
                 " SELECT write_id, tenant, source, source_lead_id, is_test, 'dup' FROM sheet")
    conn.commit()
    conn.close()
    out = env.cli("poll-status", code=74)  # its one read failed
    assert (out["failed"], out["missing"]) == (1, 0)
    doc = env.status()
    assert env.all_records()[0]["state"] == "confirmed"
    assert doc["poll_health"][0]["failure"] == "ambiguous"


def test_observe_changed_unchanged_missing(env: CliStore) -> None:
    env.confirmed(1)
    rec = write_json(env.dir / "e.json", event(0))
    won = write_json(env.dir / "won.json", {"status": "won"})
    gone = write_json(env.dir / "gone.json", {"missing": True})
    assert env.cli("observe", "--record", rec, "--snapshot", won) == {
        "result": "changed", "source_lead_id": "lead-0"}
    assert env.cli("observe", "--record", rec, "--snapshot", won)["result"] == "unchanged"
    events = kinds(env.status())["status_changed"]
    assert events == 1
    assert env.cli("observe", "--record", rec, "--snapshot", gone)["result"] == "missing"
    assert env.cli("observe", "--record", rec, "--snapshot", gone)["result"] == "missing"
    refused = run_main("observe", "--db", env.db, "--scope", env.scope, "--record", rec,
                      "--snapshot", won)
    assert refused.returncode == 65 and "confirmed_then_missing" in refused.stderr
    doc = env.status()
    assert env.all_records()[0]["state"] == "confirmed_then_missing"
    assert kinds(doc)["status_changed"] == 2


@pytest.mark.parametrize(
    ("snapshot", "event_doc"),
    [
        ({"missing": False}, event(0)),
        ({"missing": True, "status": "x"}, event(0)),
        ({"status": "won"}, event(99)),  # never accepted
        ({"status": "won"}, event(0, synthetic="true")),
    ],
)
def test_observe_refusals(env: CliStore, snapshot: dict, event_doc: dict) -> None:
    env.confirmed(1)
    before = env.status()
    rec = write_json(env.dir / "e.json", event_doc)
    snap = write_json(env.dir / "s.json", snapshot)
    proc = run_main("observe", "--db", env.db, "--scope", env.scope, "--record", rec,
                   "--snapshot", snap)
    assert proc.returncode == 65, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert env.status() == before


def test_observe_a_record_that_is_not_confirmed(env: CliStore) -> None:
    rec = write_json(env.dir / "e.json", event(5))
    assert run_main("accept", "--db", env.db, "--scope", env.scope, "--record", rec
                   ).returncode == 0
    snap = write_json(env.dir / "s.json", {"status": "won"})
    proc = run_main("observe", "--db", env.db, "--scope", env.scope, "--record", rec,
                   "--snapshot", snap)
    assert proc.returncode == 65 and "prepared" in proc.stderr
