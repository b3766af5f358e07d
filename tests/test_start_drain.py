"""``start --cycles N --workers …`` has one meaning (issue 19 point 7): after the N-th lead
cycle, the pipeline workers drain what is pending, in stage order, before the run ends,
bounded by ``--grace``; a signal ends the drain at once.

Before, the workers were cancelled with the last cycle: ``start --cycles 2`` with the four
workers left D1 26, D2 26, D3 0, D4 0.
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from runner import DurableWorker
from runner.loop import LoopSettings, _drain, run
from runner.signals import Shutdown
from tests.fakes import ScriptedAdapter
from tests.helpers import SCOPE, event, run_cli, write_json

pytestmark = pytest.mark.timeout(180)

ALL_WORKERS = "raw-retriever,core-processor,generic-materializer,domain-projector"


def test_cycles_with_the_four_workers_drain_every_level_before_the_run_ends(
    db_location: str, workdir: Path, scope_file: Path
) -> None:
    db, leads = db_location, 30
    records = workdir / "leads.ndjson"
    records.write_text("".join(json.dumps(event(i)) + "\n" for i in range(leads)))
    accepted = run_cli("accept", "--db", db, "--scope", scope_file, "--records", records)
    assert accepted.returncode == 0, accepted.stderr
    proc = run_cli("start", "--db", db, "--scope", scope_file, "--target", workdir / "t.db",
                   "--cycles", "2", "--interval", "0", "--workers", ALL_WORKERS)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2  # one summary per cycle asked for
    assert "pipeline.drained" in proc.stderr
    backlog = run_cli("backlog", "--db", db)
    assert json.loads(backlog.stdout)["pending_total"] == 0
    doc = json.loads(run_cli("status", "--db", db).stdout)
    assert doc["counts"]["confirmed"] == leads
    levels = doc["pipeline"]["levels"]
    assert levels["D3"] == levels["D4"] == leads and levels["D1"] >= leads
    assert doc["funnel"] == {SCOPE["form_id"]: {"new": leads}}


def test_a_stage_whose_upstream_is_not_in_the_run_drains_its_own_backlog(
    db_location: str, workdir: Path, scope_file: Path
) -> None:
    db = db_location
    for i in range(3):
        rec = write_json(workdir / f"e{i}.json", event(i))
        assert run_cli("accept", "--db", db, "--scope", scope_file, "--record",
                       rec).returncode == 0
    base = ["start", "--db", db, "--scope", scope_file, "--target", workdir / "t.db",
            "--cycles", "1", "--interval", "0"]
    first = run_cli(*base, "--workers", "raw-retriever")
    assert first.returncode == 0, first.stderr
    second = run_cli(*base, "--workers", "core-processor")
    assert second.returncode == 0, second.stderr
    stages = json.loads(run_cli("backlog", "--db", db).stdout)["stages"]
    assert stages["core_processing"] == {"lead-facts@1": 0}
    assert stages["generic_materialization"]["lead-current@1"] > 0  # not in the run


class NeverDrains:
    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True

    async def wait_done(self) -> None:
        await anyio.sleep_forever()


async def test_the_drain_is_bounded_by_the_grace(
    db_location: str, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    drain = NeverDrains()
    caplog.set_level(logging.INFO, logger="runner")
    async with DurableWorker(db_location, SCOPE, ScriptedAdapter(workdir / "t.db")) as worker:
        with anyio.fail_after(30):
            code = await run(worker, LoopSettings(cycles=1, interval=0, grace=0.2),
                             lambda _s: None, drain=drain)
    assert code == 0 and drain.requested
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "pipeline.draining" in actions and "pipeline.drain_timeout" in actions


async def test_a_signal_ends_the_drain_at_once() -> None:
    shutdown, drain = Shutdown(grace=3600), NeverDrains()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, drain, shutdown, 3600.0)
            while not drain.requested:  # the drain is under way
                await anyio.lowlevel.checkpoint()
            shutdown.on_signal(signal.SIGTERM, tg)  # as the signal watcher does
    assert shutdown.stopping and shutdown.exit_code == 0
