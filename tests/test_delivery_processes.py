"""Delivery across real processes: crashes, restarts, the lock (the store is arranged in
process; a process only for the act)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from tests.fakes import sheet_rows
from tests.helpers import (
    SCOPE,
    Child,
    CliStore,
    dump_store,
    event,
    last_json,
    run_command,
    wait_path,
)


@pytest.fixture
def env(cli_store: CliStore) -> CliStore:
    return cli_store


def test_a_crash_after_write_is_confirmed_by_a_fresh_process(env: CliStore) -> None:
    env.accept(1)  # the ingress process has exited
    crashed = env.once("--fault", "crash-after-write")
    assert crashed.returncode == 73, crashed.stderr
    assert crashed.stdout == ""  # died before answering
    assert env.records()["lead-1"]["state"] == "in_flight"
    fresh = env.once()
    assert fresh.returncode == 0, fresh.stderr
    summary = last_json(fresh.stdout)
    assert (summary["recovered"], summary["reconciled"], summary["dispatched"]) == (1, 1, 0)
    rec = env.records()["lead-1"]
    assert rec["state"] == "confirmed" and rec["attempts"] == 1
    assert len(sheet_rows(env.target)) == 1


def test_100_events_across_a_crash_and_a_restart_are_each_sent_once(env: CliStore) -> None:
    async def ingress() -> None:  # arranged in process, through the library
        async with DurableWorker(str(env.db), SCOPE) as worker:
            for i in range(100):
                assert (await worker.accept(event(i))).ok

    anyio.run(ingress)
    first = env.once("--dispatch-limit", "40")
    assert last_json(first.stdout)["confirmed"] == 40
    crashed = env.once("--fault", "crash-after-write")  # one more sent, then a crash
    assert crashed.returncode == 73
    final = env.once()
    assert final.returncode == 0, final.stderr
    recs = env.records()
    assert len(recs) == 100 and {r["state"] for r in recs.values()} == {"confirmed"}
    rows = sheet_rows(env.target)
    keys = [r[4] for r in rows]
    assert len(rows) == 100 and len(set(keys)) == 100
    assert {r["attempts"] for r in recs.values()} == {1}


def test_a_worker_stuck_in_a_send_keeps_a_second_worker_out(env: CliStore, workdir: Path) -> None:
    env.accept(1)
    env.accept(2)
    hang_dir = workdir / "hang"
    hang_dir.mkdir()
    first = Child("once", "--db", env.db, "--scope", env.scope, "--target", env.target,
                  "--fault", "hang", env={"RUNNER_HANG_DIR": str(hang_dir)})
    try:
        wait_path(hang_dir / "entered-write", first)
        before = dump_store(env.db)
        second = env.once()
        assert second.returncode == 75, second.stderr
        assert f"pid {first.proc.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert second.stdout == ""
        assert dump_store(env.db) == before  # changed nothing
        assert env.records()["lead-1"]["state"] == "in_flight"
        (hang_dir / "release").touch()
        assert first.finish(timeout=60) == 0, first.err
    finally:
        (hang_dir / "release").touch()
        first.kill()
    assert last_json("\n".join(first.out))["confirmed"] == 2
    assert len(sheet_rows(env.target)) == 2


def test_a_crash_before_the_write_stays_uncertain_and_is_never_sent(env: CliStore) -> None:
    env.accept(1)
    crashed = env.once("--fault", "crash-before-write")
    assert crashed.returncode == 73
    assert sheet_rows(env.target) == []
    for n in range(1, 6):
        proc = env.once()
        assert proc.returncode == 0, proc.stderr
        assert last_json(proc.stdout)["dispatched"] == 0
        rec = env.records()["lead-1"]
        assert (rec["state"], rec["attempts"], rec["reconcile_attempts"]) == ("uncertain", 1, n)
    assert sheet_rows(env.target) == []


def test_an_outage_is_failed_safe_then_sent(env: CliStore) -> None:
    env.accept(1)
    out = env.once("--fault", "outage", "--retry-base", "0")  # due again at once
    assert out.returncode == 0 and last_json(out.stdout)["failed_safe"] == 1
    assert env.records()["lead-1"]["state"] == "failed_safe"
    assert sheet_rows(env.target) == []
    ok = env.once()
    assert last_json(ok.stdout)["confirmed"] == 1
    rec = env.records()["lead-1"]
    assert rec["state"] == "confirmed" and rec["attempts"] == 2
    assert len(sheet_rows(env.target)) == 1


def test_timeout_fault_then_readback(env: CliStore) -> None:
    env.accept(1)
    assert last_json(env.once("--fault", "timeout").stdout)["uncertain"] == 1
    assert len(sheet_rows(env.target)) == 1
    assert last_json(env.once().stdout)["reconciled"] == 1
    assert env.records()["lead-1"]["state"] == "confirmed"
    assert len(sheet_rows(env.target)) == 1


def test_once_usage_errors(env: CliStore) -> None:
    assert env.once("--fault", "explode").returncode == 2
    assert env.once("--dispatch-limit", "0").returncode == 2
    if not env.db.startswith("postgres"):
        same = run_command("once", "--db", env.db, "--scope", env.scope, "--target", env.db)
        assert same.returncode == 2
