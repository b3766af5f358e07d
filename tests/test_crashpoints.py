"""Named crash points (issue 8.1): the registry matches the code, arming works from the
environment and from ``--fault crash-at:``, and a crash is an immediate exit 73."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runner import crashpoints
from runner.errors import UsageError
from tests.fakes import sheet_rows
from tests.helpers import ROOT, CliStore, last_json, run_command

HIT = re.compile(r'crashpoints\.hit\("([^"]+)"\)')


def test_every_registered_point_is_called_and_only_registered_points_are() -> None:
    calls: list[str] = []
    for path in (ROOT / "runner").rglob("*.py"):
        calls += HIT.findall(path.read_text(encoding="utf-8"))
    assert set(calls) == set(crashpoints.POINTS)


def test_fires_at_the_nth_hit_only_when_armed() -> None:
    fired: list[str] = []
    crashpoints.hit("dispatch.after-write")  # unarmed: nothing happens
    with crashpoints.armed("dispatch.after-write", after=2, action=fired.append):
        crashpoints.hit("dispatch.after-write")
        crashpoints.hit("poll.after-apply")
        assert fired == []
        crashpoints.hit("dispatch.after-write")
        assert fired == ["dispatch.after-write"]
    crashpoints.hit("dispatch.after-write")
    assert fired == ["dispatch.after-write"]


@pytest.mark.parametrize(("point", "after"), [("nowhere", 1), ("poll.after-apply", 0),
                                              ("poll.after-apply", "x")])
def test_bad_arming_is_a_usage_error(point: str, after: object) -> None:
    with pytest.raises(UsageError):
        crashpoints.arm(point, after)  # type: ignore[arg-type]
    assert crashpoints.parse_option("crash-at:poll.after-apply@3") == ("poll.after-apply", 3)


@pytest.fixture
def env(workdir: Path, scope_file: Path) -> CliStore:
    return CliStore(workdir, scope_file, workdir / "queue.db")


def test_accept_crash_after_commit_gives_no_answer_and_the_retry_is_a_duplicate(env: CliStore):
    crashed = env.accept(1, env={"RUNNER_CRASH_AT": "accept.after-commit"}, ok=False)
    assert crashed.returncode == 73 and crashed.stdout == ""
    assert "simulated crash at accept.after-commit" in crashed.stderr
    retry = env.accept(1)
    assert last_json(retry.stdout)["result"] == "duplicate"
    before = env.accept(2, env={"RUNNER_CRASH_AT": "accept.before-commit"}, ok=False)
    assert before.returncode == 73 and "lead-2" not in env.records()
    assert last_json(env.accept(2).stdout)["result"] == "accepted"


def test_a_crash_after_the_target_write_is_confirmed_by_readback_never_resent(env: CliStore):
    env.accept(1)
    env.accept(2)
    crashed = env.once("--batch-size", "1", "--fault", "crash-at:dispatch.after-write@2")
    assert crashed.returncode == 73 and crashed.stdout == ""
    assert env.records()["lead-2"]["state"] == "in_flight"
    healed = env.once()
    assert healed.returncode == 0, healed.stderr
    summary = last_json(healed.stdout)
    assert (summary["recovered"], summary["reconciled"], summary["dispatched"]) == (1, 1, 0)
    assert {r["attempts"] for r in env.records().values()} == {1}
    assert sorted(r[4] for r in sheet_rows(env.target)) == ["lead-1", "lead-2"]


def test_environment_arming_reaches_poll_status(env: CliStore):
    env.accept(1)
    assert env.once().returncode == 0
    proc = run_command("poll-status", "--db", env.db, "--scope", env.scope, "--target",
                   env.target, env={"RUNNER_CRASH_AT": "poll.before-apply"})
    assert proc.returncode == 73 and proc.stdout == ""


@pytest.mark.parametrize("how", ["env", "option", "twice"])
def test_unknown_or_repeated_crash_points_exit_2(env: CliStore, how: str):
    if how == "env":
        proc = env.once(env={"RUNNER_CRASH_AT": "dispatch.sideways"})
    elif how == "option":
        proc = env.once("--fault", "crash-at:dispatch.sideways")
    else:
        proc = env.once("--fault", "crash-at:poll.after-apply", "--fault",
                        "crash-at:poll.before-apply")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not Path(env.db).exists()


def test_a_sweep_dying_before_its_commit_changes_nothing(env: CliStore) -> None:
    add = run_command("candidate", "add", "--db", env.db, "--id", "cand-1", "--ttl-minutes", "1",
                  "--now", "2026-01-01T00:00:00Z")
    assert add.returncode == 0, add.stderr
    sweep = ("sweep", "--db", env.db, "--now", "2026-01-01T00:10:00Z")
    crashed = run_command(*sweep, env={"RUNNER_CRASH_AT": "sweep.before-commit"})
    assert crashed.returncode == 73 and crashed.stdout == ""
    listed = run_command("candidate", "list", "--db", env.db)
    assert [c["status"] for c in json.loads(listed.stdout)] == ["discovered"]  # rolled back
    after = run_command(*sweep, env={"RUNNER_CRASH_AT": "sweep.after-commit"})
    assert after.returncode == 73 and after.stdout == ""
    listed = run_command("candidate", "list", "--db", env.db)
    assert [c["status"] for c in json.loads(listed.stdout)] == ["expired"]  # committed
    again = run_command(*sweep)
    assert again.returncode == 0 and last_json(again.stdout) == {"expired": 0, "reconciled": 0}
