"""Real worker processes (SPEC P4, P6): a worker killed mid-batch is replaced by another
that finishes after the lease runs out, and four workers share a backlog (1,000 inputs in
the default run, 10,000 under ``pytest -m slow``), none lost, none processed twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from runner.io.stores import open_store
from runner.leads.models import Scope
from runner.store import Store
from tests.helpers import Child, run_main, wait_path
from tests.pipeline_fixtures import lead_history, level, query

pytestmark = pytest.mark.timeout(180)
PLUGIN = "tests.procs.pipeline_plugin"


def _backlog(db: str) -> dict:
    import json

    proc = run_main("backlog", "--db", db)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_until_drained(db: str, stage: str, children: list[Child], timeout: float = 120
                       ) -> None:
    """Wait (checking the store, never sleeping a fixed time) until a stage's backlog is
    empty; fail early if a worker died."""
    deadline = time.monotonic() + timeout
    while sum(_backlog(db)["stages"][stage].values()):
        for child in children:
            assert child.proc.poll() is None, f"worker exited: {child.err}"
        assert time.monotonic() < deadline, "the backlog never drained"
        time.sleep(0.05)


def _worker(db: str, name: str, *extra: str, env: dict[str, str] | None = None) -> Child:
    return Child("worker", name, "--db", db, "--poll-interval", "0.05", "--plugin", PLUGIN,
                 *extra, env=env)


def _stop(children: list[Child]) -> None:
    """SIGTERM every worker once it is up, and make sure each is gone, whatever fails."""
    try:
        for child in children:  # a worker still starting up has no signal handler yet
            child.wait_err("worker.started")
        for child in children:
            child.signal(signal.SIGTERM)
        codes = [child.finish() for child in children]
    finally:
        for child in children:
            child.kill()
    assert codes == [0] * len(children), [child.err for child in children]


async def test_a_worker_killed_mid_batch_is_replaced_after_its_lease_runs_out(
    store: Store, scope: Scope, db_location: str, workdir: Path
) -> None:
    await lead_history(store, scope, 60, confirm=range(40), statuses={1: "won", 2: "lost"})
    assert run_main("job", "backfill", "--db", db_location).returncode == 0
    marker = workdir / "claimed"
    victim = _worker(db_location, "core-processor", "--lease", "1", "--batch-size", "50",
                     env={"RUNNER_TEST_HANG_FILE": str(marker)})
    try:
        wait_path(marker, victim)
        victim.proc.kill()  # SIGKILL, mid-batch
        victim.proc.wait(timeout=10)
    finally:
        victim.kill()
    held = [int(x) for x in marker.read_text().split(",")]
    assert len(held) == 50
    assert query(db_location, "SELECT count(*) FROM pipeline_work WHERE state = 'claimed'"
                 ) == [(50,)]
    replacement = _worker(db_location, "core-processor", "--lease", "1")
    try:
        wait_until_drained(db_location, "core_processing", [replacement])
    finally:
        _stop([replacement])
    # the killed batch was processed again, once more: attempts 2 for its items
    attempts = dict(query(db_location, "SELECT input_id, attempts FROM pipeline_work "
                                       "WHERE processor = 'lead-facts'"))
    assert {attempts[i] for i in held} == {2}
    for name in ("replay-generic-materialization", "replay-domain-projection"):
        assert run_main("job", name, "--db", db_location).returncode == 0
    # exactly one current outcome per (input, processor, version), all terminal
    assert query(db_location, "SELECT count(*), count(DISTINCT input_id || processor || "
                              "version), min(state), max(state) FROM pipeline_work"
                 )[0] == (query(db_location, "SELECT count(*) FROM pipeline_work")[0][0],) * 2 \
        + ("done", "done")
    # D2-D4 hold no duplicate: one fact per lead event, one row per lead, one funnel entry
    # per confirmed lead
    async with await open_store(db_location) as fresh:
        d2, d3, d4 = (await level(fresh, 2), await level(fresh, 3), await level(fresh, 4))
        funnel = await fresh.funnel()
    events = query(db_location, "SELECT count(*) FROM outbox")[0][0]
    assert len(d2) == events and len(d3) == 60 and len(d4) == 40
    assert funnel == {scope.form_id: {"new": 38, "won": 1, "lost": 1}}


@pytest.mark.parametrize("inputs", [1_000, pytest.param(10_000, marks=pytest.mark.slow)])
async def test_four_worker_processes_share_a_backlog_none_lost_none_twice(
    store: Store, scope: Scope, db_location: str, inputs: int
) -> None:
    await lead_history(store, scope, inputs)
    batch = str(min(100, inputs // 40))  # 40 batches or more: enough to be shared
    workers = [_worker(db_location, "core-processor", "--lease", "30", "--batch-size", batch)
               for _ in range(4)]
    try:
        for worker in workers:  # all four are up and polling before the backlog appears
            worker.wait_err("worker.started")
        assert run_main("job", "backfill", "--db", db_location, "--batch-size", "1000"
                        ).returncode == 0
        wait_until_drained(db_location, "core_processing", workers)
    finally:
        _stop(workers)
    rows = query(db_location, "SELECT count(*), count(DISTINCT input_id), min(attempts), "
                              "max(attempts), min(state), max(state) FROM pipeline_work "
                              "WHERE processor = 'lead-facts'")
    assert rows == [(inputs, inputs, 1, 1, "done", "done")]  # each claimed exactly once
    assert query(db_location, "SELECT count(*) FROM pipeline_outcome_history") == [(0,)]
    owners = query(db_location, "SELECT count(DISTINCT owner) FROM pipeline_work")
    assert owners[0][0] >= 2  # the work was shared
    assert query(db_location, "SELECT count(*), count(DISTINCT key) FROM pipeline_records "
                              "WHERE level = 2") == [(inputs, inputs)]
