"""``start`` with real processes and real signals: grace, hard stops, SIGINT ignored by
the parent, reconcile before dispatch, the lock."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.fakes import sheet_rows
from tests.helpers import Child, CliStore, last_json, run_main, wait_path


class Setup(CliStore):
    """A store (arranged in process) and ``start`` as a real process, with the hang faults
    of ``$RUNNER_HANG_DIR``."""

    def __init__(self, workdir: Path, scope_file: Path, db: str) -> None:
        super().__init__(workdir, scope_file, db)
        self.hang = workdir / "hang"
        self.hang.mkdir()

    def start(self, *extra: str, **kw: object) -> Child:
        return Child("start", "--db", self.db, "--scope", self.scope, "--target", self.target,
                     *extra, env={"RUNNER_HANG_DIR": str(self.hang)},
                     **kw)  # type: ignore[arg-type]

    def release(self) -> None:
        (self.hang / "release").touch()


@pytest.fixture
def s(workdir: Path, scope_file: Path, db_location: str) -> Setup:
    return Setup(workdir, scope_file, db_location)


def test_cycles_n_stops_with_exit_0_and_one_line_per_cycle(s: Setup) -> None:
    s.accept(1)
    proc = s.run("start", "--cycles", "3", "--interval", "0")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["confirmed"] == 1 and lines[1]["dispatched"] == 0
    assert all(line["polled"] == 1 for line in lines)


def test_a_sigterm_during_a_hanging_send_lets_it_finish(s: Setup) -> None:
    s.accept(1)
    child = s.start("--interval", "3600", "--fault", "hang")
    try:
        wait_path(s.hang / "entered-write", child)
        child.signal(signal.SIGTERM)
        child.wait_err("letting the send in flight finish")
        assert child.proc.poll() is None  # still waiting for the send
        s.release()
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    assert last_json("\n".join(child.out))["confirmed"] == 1
    rec = s.records()["lead-1"]
    assert rec["state"] == "confirmed" and rec["attempts"] == 1
    assert len(sheet_rows(s.target)) == 1


def test_two_sigterms_stop_at_once_and_the_record_is_reconciled(s: Setup) -> None:
    s.accept(1)
    child = s.start("--interval", "3600", "--fault", "hang")
    try:
        wait_path(s.hang / "entered-write", child)
        child.signal(signal.SIGTERM)
        child.wait_err("letting the send in flight finish")
        child.signal(signal.SIGTERM)
        assert child.finish(timeout=15) == 143, child.err  # prompt: the send is still hung
    finally:
        child.kill()
    rec = s.records()["lead-1"]
    assert rec["state"] in ("uncertain", "in_flight") and rec["attempts"] == 1
    nxt = s.run("start", "--cycles", "1")
    assert nxt.returncode == 0, nxt.stderr
    assert last_json(nxt.stdout)["reconciled"] == 1
    rec = s.records()["lead-1"]
    assert (rec["state"], rec["attempts"]) == ("confirmed", 1)
    assert len(sheet_rows(s.target)) == 1  # never resent


def test_grace_running_out_is_a_hard_stop(s: Setup) -> None:
    s.accept(1)
    child = s.start("--interval", "3600", "--fault", "hang", "--grace", "0.5")
    try:
        wait_path(s.hang / "entered-write", child)
        child.signal(signal.SIGINT)
        assert child.finish(timeout=15) == 130, child.err
    finally:
        child.kill()
    assert any("grace" in line for line in child.err)
    assert s.records()["lead-1"]["state"] == "uncertain"  # written in the shielded window


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_interval_wait_exits_0_promptly(s: Setup, sig: int) -> None:
    s.accept(1)
    child = s.start("--interval", "3600")
    try:
        child.wait_out_lines(1)
        child.signal(sig)
        assert child.finish(timeout=10) == 0, child.err
    finally:
        child.kill()


def test_sigint_stops_a_process_started_with_sigint_ignored(s: Setup) -> None:
    """A background job of a non-interactive shell inherits SIGINT ignored."""
    s.accept(1)
    child = s.start("--interval", "3600",
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        child.wait_out_lines(1)
        child.signal(signal.SIGINT)
        assert child.finish(timeout=10) == 0, child.err
    finally:
        child.kill()


def test_no_dispatch_while_a_reconcile_hangs(s: Setup) -> None:
    s.accept(1)
    crashed = s.run("once", "--fault", "crash-before-write")
    assert crashed.returncode == 73  # lead-1 is now in flight, never sent
    s.accept(2)
    child = s.start("--cycles", "1", "--fault", "hang-readback")
    try:
        wait_path(s.hang / "entered-read_back", child)
        recs = s.records()
        assert recs["lead-2"]["state"] == "prepared" and recs["lead-2"]["attempts"] == 0
        assert sheet_rows(s.target) == []
        s.release()
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    recs = s.records()
    assert recs["lead-1"]["state"] == "uncertain" and recs["lead-2"]["state"] == "confirmed"
    assert [r[4] for r in sheet_rows(s.target)] == ["lead-2"]


def test_a_signal_during_a_hanging_reconcile_stops_at_once(s: Setup) -> None:
    s.accept(1)
    assert s.run("once", "--fault", "crash-before-write").returncode == 73
    child = s.start("--fault", "hang-readback", "--interval", "3600")
    try:
        wait_path(s.hang / "entered-read_back", child)
        child.signal(signal.SIGTERM)
        assert child.finish(timeout=10) == 0, child.err  # a read is not waited for
    finally:
        s.release()
        child.kill()
    assert s.records()["lead-1"]["state"] == "uncertain"


def test_start_refused_while_another_worker_runs(s: Setup) -> None:
    child = s.start("--interval", "3600")
    try:
        child.wait_out_lines(1)
        second = s.run("start", "--cycles", "1")
        assert second.returncode == 75 and f"pid {child.proc.pid}" in second.stderr
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()


@pytest.mark.parametrize(
    "bad",
    [["--poll-limit", "0"], ["--poll-limit", "1001"], ["--poll-limit", "x"],
     ["--interval", "-1"], ["--cycles", "0"], ["--grace", "-2"],
     ["--interval", "nan"], ["--grace", "NaN"]],  # NaN used to escape as a traceback
)
def test_bad_options_exit_2(s: Setup, bad: list[str]) -> None:
    proc = run_main("start", "--db", s.db, "--scope", s.scope, "--target", s.target, *bad,
                    guard=False)  # refused while parsing: in process
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
