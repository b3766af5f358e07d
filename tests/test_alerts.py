"""Alerts (``--alert-command``): each fires when its condition holds, and none fires on a
healthy run; the command runs apart from the loop, bounded in time, deduplicated and
rate-limited.  The command here is a real process: a sink that appends its stdin to a
file."""

from __future__ import annotations

import json
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from runner import alerts as alerts_module
from runner.alerts import Alerts, AlertSettings
from runner.figures import LeadFigures
from runner.leads.states import LeadState
from runner.tasks.outcomes import CycleSummary
from tests.helpers import Child, CliStore, event, run_main, wait_path, write_json

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SINK = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())"


@pytest.fixture
def sink(workdir: Path) -> tuple[str, Path]:
    """``(--alert-command value, the file its alerts land in)``."""
    script = workdir / "sink.py"
    script.write_text(SINK + "\n", encoding="utf-8")
    out = workdir / "alerts.jsonl"
    return f"{sys.executable} {script} {out}", out


def received(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _figures(uncertain: int = 0, oldest: str | None = None) -> LeadFigures:
    counts = {state: 0 for state in LeadState}
    counts[LeadState.UNCERTAIN] = uncertain
    return LeadFigures(counts, oldest, None)


def _queued(alerts: Alerts) -> list[dict[str, Any]]:
    out = list(alerts._queue)
    alerts._queue.clear()
    return out


# -- deciding (no command runs) ---------------------------------------------------------


def test_a_condition_fires_once_repeats_after_the_window_and_resolves() -> None:
    alerts = Alerts(AlertSettings(["true"], poll_failures=2, repeat=100))
    failed = CycleSummary(polled=4, poll_failed=4)
    alerts.cycle_done(failed, None, 0.0, T0)
    assert _queued(alerts) == []  # one failed pass: below the threshold
    for now in (1.0, 2.0, 50.0):
        alerts.cycle_done(failed, None, now, T0)
    firing = _queued(alerts)
    assert [(a["alert"], a["state"], a["passes"]) for a in firing] == [
        ("poll_failing", "firing", 2)]
    alerts.cycle_done(failed, None, 101.0, T0)  # still failing, the window has passed
    assert [a["state"] for a in _queued(alerts)] == ["firing"]
    alerts.cycle_done(CycleSummary(polled=4, poll_failed=1), None, 102.0, T0)
    resolved = _queued(alerts)
    assert [(a["alert"], a["state"]) for a in resolved] == [("poll_failing", "resolved")]


def test_new_uncertain_records_alert_once_per_window_and_count_what_was_held_back() -> None:
    alerts = Alerts(AlertSettings(["true"], repeat=100))
    for now in (0.0, 10.0, 20.0):
        alerts.cycle_done(CycleSummary(uncertain=1), _figures(1), now, T0)
    first = _queued(alerts)
    assert [(a["alert"], a["new"], a["suppressed"]) for a in first] == [
        ("record_uncertain", 1, 0)]
    alerts.cycle_done(CycleSummary(uncertain=2), _figures(4), 150.0, T0)
    (second,) = _queued(alerts)
    assert (second["new"], second["uncertain_now"], second["suppressed"]) == (2, 4, 2)


def test_more_alerts_than_the_hourly_limit_are_dropped_and_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alerts_module, "PER_HOUR", 2)
    alerts = Alerts(AlertSettings(["true"], repeat=1))
    for now in (0.0, 2.0, 4.0, 6.0):
        alerts.cycle_done(CycleSummary(uncertain=1), None, now, T0)
    assert len(_queued(alerts)) == 2
    alerts.cycle_done(CycleSummary(uncertain=1), None, 3700.0, T0)  # an hour later
    (later,) = _queued(alerts)
    assert later["dropped"] == 2


def test_a_stall_begins_after_the_threshold_and_ends_with_the_next_cycle() -> None:
    alerts = Alerts(AlertSettings(["true"], cycle_stall=30))
    alerts.started(0.0)
    assert alerts.next_stall_check() == pytest.approx(30.001)
    alerts.check_stall(29.0)
    assert _queued(alerts) == []
    alerts.check_stall(31.0)
    (stalled,) = _queued(alerts)
    assert stalled["alert"] == "cycle_stalled" and stalled["seconds_since_last_cycle"] == 31
    alerts.cycle_done(CycleSummary(), None, 40.0, T0)
    assert [(a["alert"], a["state"]) for a in _queued(alerts)] == [
        ("cycle_stalled", "resolved")]


def test_an_old_uncertain_record_fires_and_a_young_one_does_not() -> None:
    alerts = Alerts(AlertSettings(["true"], uncertain_age=3600))
    young = (T0 - timedelta(minutes=59)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    alerts.cycle_done(CycleSummary(), _figures(1, young), 0.0, T0)
    assert _queued(alerts) == []
    old = (T0 - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    alerts.cycle_done(CycleSummary(), _figures(1, old), 1.0, T0)
    (alert,) = _queued(alerts)
    assert alert["alert"] == "uncertain_too_old" and alert["oldest_age_seconds"] == 7200


# -- sending: a real command -----------------------------------------------------------


async def test_the_command_gets_the_document_on_stdin(sink: tuple[str, Path]) -> None:
    command, out = sink
    alerts = Alerts(AlertSettings(command.split(), store="queue.db"))
    await alerts.send_now(alerts.store_failed("store_full", "the disk is full"))
    (alert,) = received(out)
    assert alert["alert"] == "store_failed" and alert["reason"] == "store_full"
    assert alert["store"] == "queue.db" and alert["ts"].endswith("Z")


async def test_a_hanging_command_is_killed_and_a_failing_one_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    hanging = Alerts(AlertSettings([sys.executable, "-c", "import time; time.sleep(60)"],
                                   timeout=0.2))
    with anyio.fail_after(30):
        await hanging.send_now(hanging.store_failed("x", "y"))
    failing = Alerts(AlertSettings([sys.executable, "-c", "raise SystemExit(3)"]))
    await failing.send_now(failing.store_failed("x", "y"))
    missing = Alerts(AlertSettings(["/nonexistent/alert-command"]))
    await missing.send_now(missing.store_failed("x", "y"))
    messages = [r.getMessage() for r in caplog.records if r.name == "runner.alerts"]
    assert any("did not finish within 0.2s; killed" in m for m in messages)
    assert any("exited 3" in m for m in messages)
    assert any("cannot run the alert command" in m for m in messages)


# -- end to end: the CLI ------------------------------------------------------------------


def test_a_healthy_run_sends_no_alert(cli_store: CliStore, sink: tuple[str, Path]) -> None:
    command, out = sink
    cli_store.accept(1, 2)
    done = cli_store.run("start", "--cycles", "3", "--interval", "0",
                         "--alert-command", command, "--alert-uncertain-age", "1",
                         "--alert-poll-failures", "1", "--alert-cycle-stall", "1")
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["confirmed"] for x in done.stdout.splitlines()] == [2, 0, 0]
    assert received(out) == []


def test_records_that_become_uncertain_alert(cli_store: CliStore,
                                             sink: tuple[str, Path]) -> None:
    command, out = sink
    cli_store.accept(1, 2)
    done = cli_store.once("--fault", "timeout", "--alert-command", command)
    assert done.returncode == 0, done.stderr
    (alert,) = received(out)
    assert (alert["alert"], alert["new"], alert["uncertain_now"]) == ("record_uncertain", 2, 2)


def test_an_uncertain_record_that_waits_too_long_alerts(
        cli_store: CliStore, sink: tuple[str, Path]) -> None:
    command, out = sink
    at = T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    later = (T0 + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = write_json(cli_store.dir / "e1.json", event(1))
    assert cli_store.run("accept", "--record", record, "--now", at).returncode == 0
    # a crash before the write leaves it in flight: nothing reached the target
    crashed = cli_store.once("--fault", "crash-before-write", "--now", at)
    assert crashed.returncode == 73, crashed.stderr
    # two hours on: recovery makes it uncertain, its readback finds no row, it stays so
    done = cli_store.once("--now", later, "--alert-command", command,
                          "--alert-uncertain-age", "3600")
    assert done.returncode == 0, done.stderr
    kinds = {a["alert"]: a for a in received(out)}
    assert kinds["record_uncertain"]["new"] == 1
    assert kinds["uncertain_too_old"]["oldest_age_seconds"] == 7200
    assert sorted(kinds) == ["record_uncertain", "uncertain_too_old"]


def test_poll_passes_that_keep_failing_alert_after_the_threshold(
        cli_store: CliStore, sink: tuple[str, Path]) -> None:
    command, out = sink
    cli_store.accept(1)
    assert cli_store.once().returncode == 0
    below = cli_store.run("start", "--cycles", "2", "--interval", "0", "--fault",
                          "read-error", "--alert-command", command,
                          "--alert-poll-failures", "3")
    assert below.returncode == 0, below.stderr
    assert received(out) == []
    done = cli_store.run("start", "--cycles", "3", "--interval", "0", "--fault",
                         "read-error", "--alert-command", command,
                         "--alert-poll-failures", "3")
    assert done.returncode == 0, done.stderr
    (alert,) = received(out)
    assert (alert["alert"], alert["state"], alert["passes"]) == ("poll_failing", "firing", 3)


def test_a_stalled_cycle_alerts_and_its_end_resolves_it(
        cli_store: CliStore, sink: tuple[str, Path]) -> None:
    command, out = sink
    hang = cli_store.dir / "hang"
    hang.mkdir()
    cli_store.accept(1)
    child = Child("start", "--db", cli_store.db, "--scope", cli_store.scope, "--target",
                  cli_store.target, "--interval", "0.05", "--fault", "hang",
                  "--alert-command", command, "--alert-cycle-stall", "0.5",
                  env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-write", child)
        wait_path(out, child)
        child.wait_for(lambda c: any("alert cycle_stalled firing sent" in x for x in c.err),
                       what="the stall alert sent")
        (hang / "release").touch()
        child.wait_for(lambda c: any("alert cycle_stalled resolved sent" in x for x in c.err),
                       what="the stall's resolution sent")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()
    states = [(a["alert"], a["state"]) for a in received(out)]
    assert states == [("cycle_stalled", "firing"), ("cycle_stalled", "resolved")]


def test_a_store_that_cannot_be_reached_alerts(workdir: Path, scope_file: Path,
                                               sink: tuple[str, Path]) -> None:
    pytest.importorskip("asyncpg")
    command, out = sink
    done = run_main("once", "--db", "postgresql://runner@127.0.0.1:1/none", "--scope",
                    scope_file, "--target", workdir / "t.db", "--alert-command", command)
    assert done.returncode == 74, done.stderr
    (alert,) = received(out)
    assert alert["alert"] == "store_failed"
    assert "127.0.0.1:1" in alert["store"] and "error" in alert


def test_a_stall_threshold_within_the_interval_is_a_usage_error(
        cli_store: CliStore, sink: tuple[str, Path]) -> None:
    done = cli_store.run("start", "--cycles", "1", "--interval", "5",
                         "--alert-command", sink[0], "--alert-cycle-stall", "5")
    assert done.returncode == 2
    assert "must be more than --interval" in done.stderr
