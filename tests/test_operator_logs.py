"""Logs an operator can live with (issue 19 point 5): dated lines, ``ts`` in every JSON
line, ``--log-file`` reopened on SIGHUP, a start-up banner, quiet idle cycles with a
heartbeat, refusals answered on stdout, and ``poll-status`` failing in its exit code.

Output shapes and exit codes run in process (``runner.cli.main``); the log file's reopen,
the banner and idle cycles of a long run are tested on a real ``start`` process with real
signals.  Every test runs on both backends where a store is involved.
"""

from __future__ import annotations

import json
import re
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from runner.cli import main
from tests.helpers import CANARY, SCOPE, Child, event, run_cli, write_json

pytestmark = pytest.mark.timeout(120)

TEXT_LINE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z \S")
JSON_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def rec(workdir: Path) -> Path:
    return write_json(workdir / "e.json", event(1, contact_alias=CANARY))


def test_text_lines_are_dated_in_iso_8601_utc(
    db_location: str, workdir: Path, scope_file: Path, rec: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--db", db_location, "--scope", scope_file]
    assert run(capsys, "accept", *common, "--record", rec)[0] == 0
    code, _, err = run(capsys, "once", *common, "--target", workdir / "t.db")
    assert code == 0
    lines = err.strip().splitlines()
    assert lines and all(TEXT_LINE.match(line) for line in lines), lines
    assert any("lead.confirmed" in line for line in lines)


def test_every_json_line_carries_ts_the_error_line_too(
    db_location: str, workdir: Path, scope_file: Path, rec: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--db", db_location, "--scope", scope_file, "--log-format", "json"]
    assert run(capsys, "accept", *common, "--record", rec)[0] == 0
    code, _, err = run(capsys, "once", *common, "--target", workdir / "t.db")
    assert code == 0
    docs = [json.loads(line) for line in err.strip().splitlines()]
    assert docs and all(JSON_TS.match(d["ts"]) for d in docs)
    # an error line (another worker's store: here, a missing one) carries ts as well
    code, out, err = run(capsys, "status", "--db", str(workdir / "absent.db"),
                         "--log-format", "json")
    assert code == 66 and out == ""
    (doc,) = [json.loads(line) for line in err.strip().splitlines()]
    assert doc["action"] == "command.failed" and JSON_TS.match(doc["ts"])


def test_log_file_appends_0600_and_keeps_the_error_line(
    db_location: str, workdir: Path, scope_file: Path, rec: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = workdir / "runner.log"
    log.write_text("an older line\n")
    log.chmod(0o644)
    common = ["--db", db_location, "--scope", scope_file, "--log-file", log]
    assert run(capsys, "accept", *common, "--record", rec)[0] == 0
    code, out, err = run(capsys, "once", *common, "--target", workdir / "t.db")
    assert code == 0 and json.loads(out)["confirmed"] == 1
    assert err == ""  # the lines went to the file
    text = log.read_text()
    assert text.startswith("an older line\n")  # appended
    assert "lead.confirmed" in text and CANARY not in text
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    # a failed command: its one line on stderr, and dated in the file too
    code, _, err = run(capsys, "once", *common, "--target", workdir / "t.db",
                       "--poll-limit", "5", "--fault", "no-such-fault")
    assert code == 2 and "runner: error:" in err
    last = log.read_text().strip().splitlines()[-1]
    assert TEXT_LINE.match(last) and "command.failed" in last


def test_a_symlinked_log_file_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = workdir / "real.log"
    real.write_text("")
    (workdir / "link.log").symlink_to(real)
    code, _, err = run(capsys, "status", "--db", str(workdir / "q.db"), "--log-file",
                       workdir / "link.log")
    assert code == 77 and "symlinked --log-file" in err
    assert real.read_text() == ""


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_file(child: Child, path: Path, text: str) -> None:
    """Wait until ``path`` holds a line with ``text`` (re-checked as the child writes)."""
    child.wait_for(lambda _c: any(text in line for line in read_lines(path)), 30,
                   f"{text!r} in {path.name}")


def start(db: str, scope_file: Path, workdir: Path, *extra: str | Path) -> Child:
    return Child("start", "--db", db, "--scope", scope_file, "--target", workdir / "t.db",
                 "--interval", "0.05", *extra)


def test_sighup_reopens_the_log_file_and_the_stop_lines_land_in_the_new_one(
    db_location: str, workdir: Path, scope_file: Path
) -> None:
    log, rotated = workdir / "runner.log", workdir / "runner.log.1"
    child = start(db_location, scope_file, workdir, "--log-file", log, "--heartbeat", "0.2")
    try:
        wait_file(child, log, "runner.started")
        log.rename(rotated)  # what logrotate does, before it signals
        child.signal(signal.SIGHUP)
        wait_file(child, log, "log.reopened")
        wait_file(child, log, "runner.heartbeat")  # the run goes on, into the new file
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    new, old = log.read_text(), rotated.read_text()
    assert "runner.started" in old and "runner.started" not in new
    assert "runner.stopping" in new and "runner.stopping" not in old
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert all(TEXT_LINE.match(line) for line in new.splitlines())
    assert child.err == []  # nothing went to stderr


def test_banner_says_what_runs_and_never_a_password(
    backend: str, db_location: str, workdir: Path, scope_file: Path
) -> None:
    db = db_location
    if backend == "postgres":  # trust auth: the password is ignored, never shown
        db = re.sub(r"://([^:@/]+)@", r"://\1:hunter2-secret@", db, count=1)
        assert "hunter2-secret" in db
    child = start(db, scope_file, workdir, "--log-format", "json")
    try:
        child.wait_err("runner.started")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    (banner,) = [json.loads(line) for line in child.err if "runner.started" in line]
    import runner

    assert banner["version"] == runner.__version__ and banner["pid"] == child.proc.pid
    assert banner["scope"] == "/".join(SCOPE[k] for k in ("tenant_id", "account_id",
                                                           "page_id", "form_id"))
    assert banner["target"] == str(workdir / "t.db") and banner["interval"] == 0.05
    assert banner["store"]
    everything = "\n".join(child.err + child.out)
    assert "hunter2-secret" not in everything


def test_idle_cycles_are_quiet_with_a_heartbeat_and_work_still_prints(
    db_location: str, workdir: Path, scope_file: Path, rec: Path
) -> None:
    db = db_location
    child = start(db, scope_file, workdir, "--heartbeat", "0.3", "--log-level", "debug")
    try:
        child.wait_for(lambda c: sum("runner.heartbeat" in line for line in c.err) >= 2,
                       30, "two heartbeats")
        assert len(child.out) == 1  # the first cycle only: many idle ones went by
        assert any("cycle.idle" in line for line in child.err)  # at debug level
        accepted = run_cli("accept", "--db", db, "--scope", scope_file, "--record", rec)
        assert accepted.returncode == 0, accepted.stderr
        child.wait_for(lambda c: any(json.loads(line)["dispatched"] for line in c.out),
                       30, "a cycle that sent the record")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    sent = [json.loads(line) for line in child.out if json.loads(line)["dispatched"]]
    assert sent[0]["confirmed"] == 1


def test_idle_cycles_are_not_logged_at_the_default_level(
    db_location: str, workdir: Path, scope_file: Path
) -> None:
    child = start(db_location, scope_file, workdir, "--heartbeat", "0.2")
    try:
        child.wait_for(lambda c: sum("runner.heartbeat" in line for line in c.err) >= 2,
                       30, "two heartbeats")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    assert not any("cycle.idle" in line for line in child.err)
    assert len(child.out) == 1


def test_refusals_answer_one_json_line_on_stdout(
    db_location: str, workdir: Path, scope_file: Path, rec: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--db", db_location, "--scope", scope_file]
    assert run(capsys, "accept", *common, "--record", rec)[0] == 0
    snap = write_json(workdir / "snap.json", {"status": "won"})
    cases: list[tuple[list[Any], str]] = [
        (["observe", *common, "--record", rec, "--snapshot", snap], "not_confirmed"),
        (["observe", *common, "--record", write_json(workdir / "o.json", event(9)),
          "--snapshot", snap], "unknown_record"),
        (["candidate", "analyze", "--db", db_location, "--id", "nope", "--analyst", "a1"],
         "unknown_candidate"),
        (["accept", "--db", db_location, "--scope", workdir / "no-scope.json", "--records",
          rec], "unreadable"),
    ]
    for argv, reason in cases:
        code, out, err = run(capsys, *argv)
        assert code == 65, (argv, err)
        (answer,) = [json.loads(line) for line in out.splitlines()]
        assert answer["result"] == "refused", argv
        assert answer["reason"] == reason, (argv, answer)
        assert len(err.strip().splitlines()) == 1


def test_poll_status_exits_74_when_every_read_failed(
    db_location: str, workdir: Path, scope_file: Path, rec: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--db", db_location, "--scope", scope_file, "--target", workdir / "t.db"]
    # nothing to poll is not a failure
    assert run(capsys, "poll-status", *common, "--fault", "read-error")[0] == 0
    assert run(capsys, "accept", "--db", db_location, "--scope", scope_file,
               "--record", rec)[0] == 0
    code, out, _ = run(capsys, "once", *common, "--fault", "read-error")
    assert code == 0  # a cycle delivers; its summary says the poll pass read nothing
    summary = json.loads(out)
    assert summary["polled"] == summary["poll_failed"] == 1 and summary["confirmed"] == 1
    code, out, err = run(capsys, "poll-status", *common, "--fault", "read-error")
    assert code == 74, err
    assert json.loads(out) == {"polled": 1, "changed": 0, "unchanged": 0, "missing": 0,
                               "failed": 1}  # the summary is printed first
    assert "every status read of the pass failed" in err
    code, out, _ = run(capsys, "poll-status", *common)
    assert code == 0 and json.loads(out)["failed"] == 0


def test_log_lines_never_carry_the_dsn_password(backend: str) -> None:
    """``describe_location`` is what every line uses for a PostgreSQL store."""
    if backend != "postgres":
        pytest.skip("a DSN is PostgreSQL's")
    from runner.io.stores import describe_location

    assert "pw-123" not in describe_location(
        "postgresql://user:pw-123@db.example:5432/app?schema=runner")
