"""The loop's shape (issue 4 points 5 and 7): background tasks are isolated from the lead
cycle; logs are one readable line per state change, or JSON, never contact fields."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from runner.loop import LoopSettings, run
from runner.tasks.outcomes import CycleSummary
from tests.fakes import ScriptedAdapter
from tests.helpers import CANARY, SCOPE, event, run_cli, run_main, write_json


async def test_a_failing_or_hanging_background_task_never_delays_the_lead_cycle(
    db_location: str, workdir: Path
) -> None:
    failures = 0
    hung = anyio.Event()

    async def failing() -> None:
        nonlocal failures
        failures += 1
        raise RuntimeError("background task exploded")

    async def hanging() -> None:
        hung.set()
        await anyio.sleep_forever()

    summaries: list[CycleSummary] = []
    async with DurableWorker(db_location, SCOPE, ScriptedAdapter(workdir / "t.db")) as worker:
        for i in range(3):
            await worker.accept(event(i))
        with anyio.fail_after(30):
            code = await run(worker, LoopSettings(cycles=3, interval=0), summaries.append,
                             background=[("failing", failing), ("hanging", hanging)])
    assert code == 0
    assert [s.confirmed for s in summaries] == [3, 0, 0]
    assert failures >= 1 and hung.is_set()


def test_text_logs_name_records_by_key_one_line_per_change(
    workdir: Path, scope_file: Path, db_location: str
) -> None:
    db, target = db_location, workdir / "t.db"
    rec = write_json(workdir / "e.json", event(1, contact_alias=CANARY))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    proc = run_cli("start", "--db", db, "--scope", scope_file, "--target", target,
                   "--cycles", "1")
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert any("lead.in_flight" in line and "key=lead-1" in line for line in lines)
    assert any("lead.confirmed" in line and "key=lead-1" in line for line in lines)
    assert CANARY not in proc.stderr and CANARY not in proc.stdout


def test_json_logs_for_machines(workdir: Path, scope_file: Path, db_location: str) -> None:
    db, target = db_location, workdir / "t.db"
    rec = write_json(workdir / "e.json", event(1, contact_alias=CANARY))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    proc = run_cli("start", "--db", db, "--scope", scope_file, "--target", target,
                   "--cycles", "1", "--log-format", "json", "--fault", "timeout")
    assert proc.returncode == 0
    docs = [json.loads(line) for line in proc.stderr.strip().splitlines()]
    actions = [(d["action"], d.get("key")) for d in docs]
    assert ("lead.in_flight", "lead-1") in actions and ("lead.uncertain", "lead-1") in actions
    assert all({"ts", "level", "message", "action"} <= set(d) for d in docs)
    assert CANARY not in proc.stderr


async def test_a_store_error_in_the_lead_loop_is_raised_as_itself(
    db_location: str, workdir: Path
) -> None:
    """Found by the issue 8 disk-full test: a StoreError (a full store) raised in a cycle
    left the task group as an ExceptionGroup, and the CLI printed a traceback (exit 1)."""
    from runner.errors import StoreFull

    async with DurableWorker(db_location, SCOPE, ScriptedAdapter(workdir / "t.db")) as worker:
        await worker.accept(event(1))

        async def full(*_args: object) -> None:
            raise StoreFull("the store is full (test)")

        # the cycle's first read (the uncertain records to reconcile) finds the store full
        worker.store.reconcile_order = full  # type: ignore[method-assign]
        with anyio.fail_after(30), pytest.raises(StoreFull):
            await run(worker, LoopSettings(cycles=1, interval=0), lambda _s: None)


def test_start_runs_the_lifecycle_sweep_as_its_own_task(workdir: Path, scope_file: Path) -> None:
    import signal

    from tests.helpers import Child

    db, target = workdir / "q.db", workdir / "t.db"
    add = run_main("candidate", "add", "--db", db, "--id", "cand-1", "--ttl-minutes", "1",
                  "--now", "2026-01-01T00:00:00Z")
    assert add.returncode == 0, add.stderr
    child = Child("start", "--db", db, "--scope", scope_file, "--target", target,
                  "--interval", "3600")
    try:
        child.wait_out_lines(1)
        # the sweep runs beside the lead loop: wait for its log line (logged after its
        # commit), then read the recorded result
        child.wait_err("sweepCandidates: expired=")
        doc = json.loads(run_main("status", "--db", db).stdout)
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    assert doc["lifecycle"]["last_sweep"]["result"] == {"expired": 1, "reconciled": 0}
    assert doc["lifecycle"]["counts"]["expired"] == 1
