"""A newcomer's findings of issue 31 that were code, each proved on what runner does now:
a ``--target`` typo or the store's own file is refused instead of becoming a target; help
and errors agree (a day unit, the faults listed); refused webhooks are logged by reason,
rate-limited; ``serve`` and ``start`` say when they start and stop, a deliberate stop at
info level; and the small warts (a port in ``count``, a doubled prefix, ``config show``'s
command, a misplaced ``--config``, demo.sh's filter, a refused ``resolve``)."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
from pathlib import Path

import pytest

from runner.cli import build_parser
from runner.leads.pacing import parse_duration
from tests.helpers import (
    CANARY,
    ROOT,
    Child,
    event,
    last_json,
    run_cli,
    run_main,
    store_exists,
    write_json,
)
from tests.httpkit import SECRET, TOKEN, body_of, port_of, serving, signed

pytestmark = pytest.mark.timeout(90)


def once(workdir: Path, scope_file: Path, target: str, *extra: str):
    rec = write_json(workdir / "e.json", event(1))
    db = str(workdir / "q.db")
    run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
    return run_main("once", "--db", db, "--scope", scope_file, "--target", target, *extra,
                    cwd=workdir)


# -- finding 7: a typo is no target -------------------------------------------------------


@pytest.mark.parametrize("typo", ["htp:sheet", "sheet", "target.json", "q.db-wal"])
def test_a_target_that_is_no_url_dsn_or_sqlite_file_is_refused(
        workdir: Path, scope_file: Path, typo: str) -> None:
    proc = once(workdir, scope_file, typo)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not a target" in proc.stderr
    assert "sqlite:PATH" in proc.stderr and "did you mean" not in proc.stderr
    assert not (workdir / typo).exists()  # never created, never pinned
    status = last_json(run_main("status", "--db", workdir / "q.db").stdout)
    assert status["counts"]["prepared"] == 1


@pytest.mark.parametrize(("typo", "meant"), [
    ("http//127.0.0.1:8700/sheet", "http://127.0.0.1:8700/sheet"),
    ("https:/example.invalid/sheet", "https://example.invalid/sheet"),
    ("postgresql//127.0.0.1/crm", "postgresql://127.0.0.1/crm"),
])
def test_a_url_missing_its_colon_or_slash_gets_did_you_mean(
        workdir: Path, scope_file: Path, typo: str, meant: str) -> None:
    proc = once(workdir, scope_file, typo)
    assert proc.returncode == 2 and f"did you mean {meant}?" in proc.stderr, proc.stderr
    assert not (workdir / "http").exists()


def test_sqlite_prefix_names_a_target_file_of_any_name(workdir: Path, scope_file: Path) -> None:
    proc = once(workdir, scope_file, "sqlite:sheet")
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["confirmed"] == 1 and (workdir / "sheet").is_file()
    from runner.io.targets.compose import check_target_text

    for name in ("t.db", "t.sqlite", "t.SQLITE3", "http://h/x", "postgresql://h/d"):
        assert check_target_text(name) == name


# -- finding 9: the store's own files ----------------------------------------------------


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal", ""])
def test_the_stores_own_files_are_refused_as_target(
        workdir: Path, scope_file: Path, suffix: str) -> None:
    proc = once(workdir, scope_file, f"sqlite:q.db{suffix}")
    assert proc.returncode == 2, proc.stderr
    assert ("same file" if not suffix else f"store's own {suffix[1:]} file") in proc.stderr
    status = last_json(run_main("status", "--db", workdir / "q.db").stdout)
    assert status["counts"]["prepared"] == 1


# -- finding 8: help and errors agree ----------------------------------------------------


def test_a_day_unit_is_a_duration_and_the_bound_is_said_alike() -> None:
    assert parse_duration("2d") == 2 * 86400 and parse_duration("1.5d") == 1.5 * 86400
    args = build_parser(["once"]).parse_args(
        ["once", "--db", "q.db", "--scope", "s.json", "--target", "t.db", "--retry-cap", "2d"])
    assert args.retry_cap == 172800
    proc = run_main("once", "--db", "q.db", "--scope", "s.json", "--target", "t.db",
                    "--retry-cap", "30d")
    assert proc.returncode == 2 and "less than 30 days" in proc.stderr, proc.stderr
    help_text = " ".join(build_parser(["once"])._subparsers._group_actions[0]  # type: ignore[union-attr]
                         .choices["once"].format_help().split())
    assert "less than 30 days" in help_text and "2d" in help_text
    operate = " ".join((ROOT / "docs/how-to/operate.md").read_text().split())
    assert "less than 30 days" in operate and "up to a day, 86400" in operate


def test_an_unknown_fault_lists_the_faults_help_lists(
        workdir: Path, scope_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # no line breaks inside a fault's name
    proc = run_main("once", "--db", workdir / "q.db", "--scope", scope_file, "--target",
                    workdir / "t.db", "--fault", "bogus")
    assert proc.returncode == 2
    known = re.search(r"known: ([^)]*)\)", proc.stderr)
    assert known is not None, proc.stderr
    help_text = " ".join(build_parser(["once"])._subparsers._group_actions[0]  # type: ignore[union-attr]
                         .choices["once"].format_help().split())
    for name in known.group(1).split(", "):
        assert name in help_text, name
    assert "hang" not in known.group(1)  # for tests only ($RUNNER_HANG_DIR)


# -- finding 6: refusals leave a trace, serve says when it starts and stops -------------


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_refused_webhooks_are_logged_by_reason_and_rate_limited(db_location: str) -> None:
    lines = Lines()
    logger = logging.getLogger("runner.http")
    logger.addHandler(lines)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with serving(db_location) as s:
            body = body_of(event(1, contact_alias=CANARY))
            for _ in range(5):  # a flood: one line per reason
                assert (await s.post(body, headers={})).status_code == 401
                assert (await s.post(body, headers=signed(body, b"wrong"))).status_code == 403
            handshake = await s.client.get(f"{s.url}/webhook?hub.mode=subscribe&"
                                           "hub.verify_token=wrong&hub.challenge=1")
            assert handshake.status_code == 403
    finally:
        logger.removeHandler(lines)
        logger.setLevel(old_level)
    refused = [r for r in lines.records if getattr(r, "action", "") == "http.refused"]
    assert [(r.reason, r.status) for r in refused] == [  # type: ignore[attr-defined]
        ("unsigned", 401), ("bad_signature", 403), ("handshake", 403)]
    assert all(r.levelno == logging.WARNING for r in refused)
    for record in refused:  # no body, no header, no secret, no contact field
        text = record.getMessage() + json.dumps(vars(record), default=str)
        assert CANARY not in text and SECRET.decode() not in text and TOKEN not in text


def test_serve_logs_a_banner_and_a_stop_line(workdir: Path, scope_file: Path) -> None:
    secret = workdir / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    child = Child("serve", "--db", workdir / "q.db", "--scope", scope_file, "--listen",
                  "127.0.0.1:0", "--webhook-secret-file", secret, "--log-format", "json",
                  env={"RUNNER_VERIFY_TOKEN": TOKEN})
    try:
        port = port_of(child)
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    docs = [json.loads(line) for line in child.err]
    actions = [d["action"] for d in docs]
    assert actions[0] == "serve.started" and actions[-1] == "serve.stopped", actions
    listening = next(d for d in docs if d["action"] == "http.listening")
    assert listening["port"] == port and "count" not in listening  # finding 11
    stopping = [d for d in docs if d["action"] in ("serve.stopped", "serve.started")]
    assert all(d["level"] == "info" for d in stopping)


# -- finding 11: the small warts ---------------------------------------------------------


def test_a_deliberate_stop_is_info_ends_with_stopped_and_a_refused_resolve_says_so(
        workdir: Path, scope_file: Path) -> None:
    db = workdir / "q.db"
    child = Child("start", "--db", db, "--scope", scope_file, "--target", workdir / "t.db",
                  "--interval", "0.2", "--log-format", "json")
    try:
        child.wait_out_lines(1)
        refused = run_main("resolve", "--db", db, "--write-id", "0" * 32, "--as", "confirmed",
                           "--reason", "checked by hand")
        assert refused.returncode == 75, refused.stderr
        assert "nothing was resolved" in refused.stderr
        assert "not starting" not in refused.stderr
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    docs = [json.loads(line) for line in child.err]
    stopping = next(d for d in docs if d["action"] == "runner.stopping")
    assert stopping["level"] == "info"
    assert docs[-1]["action"] == "runner.stopped" and docs[-1]["level"] == "info"


def test_an_argument_error_has_one_prefix(workdir: Path) -> None:
    proc = run_main("status", "--db", workdir / "q.db", "extra")
    assert proc.returncode == 2
    assert proc.stderr == "runner: error: unrecognized arguments: extra\n"
    assert not store_exists(workdir / "q.db")


def test_config_show_names_the_command_and_a_misplaced_config_is_explained() -> None:
    shown = run_main("config", "show", "start", "--db", "q.db", "--scope", "s.json",
                     "--target", "t.db", "--cycles", "2")
    assert shown.returncode == 0, shown.stderr
    doc = last_json(shown.stdout)
    assert doc["command"] == "start" and doc["values"]["cycles"] == {"value": 2,
                                                                      "from": "flag"}
    misplaced = run_main("config", "--config", "runner.toml")
    assert misplaced.returncode == 2
    assert "--config goes after 'show'" in misplaced.stderr
    assert "invalid choice" not in misplaced.stderr


def test_demo_step_5_hides_the_in_flight_line(workdir: Path, scope_file: Path) -> None:
    demo = (ROOT / "demo.sh").read_text()
    pattern = re.search(r"grep -Ev '([^']+)'", demo)
    assert pattern is not None
    rec = write_json(workdir / "e.json", event(1))
    db, target = workdir / "q.db", workdir / "t.db"
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    crashed = run_cli("once", "--db", db, "--scope", scope_file, "--target", target,
                      "--fault", "crash-after-write")
    assert crashed.returncode == 73
    assert any("in_flight" in line for line in crashed.stderr.splitlines())
    shown = subprocess.run(["grep", "-Ev", pattern.group(1)], input=crashed.stderr,
                           capture_output=True, text=True, timeout=10, check=False).stdout
    assert "in_flight" not in shown and "simulated crash" in shown


# -- finding 10: an unexpected field is named, escaped and cut; its value never --------


def test_a_rejection_names_an_unexpected_field_escaped_and_cut_never_its_value(
        workdir: Path, scope_file: Path) -> None:
    db = workdir / "q.db"
    for key, shown in (("extra", "extra: unexpected field"),
                       ("SOME-FIELD-name", "'SOME-FIELD-name': unexpected field"),
                       ("bad\nkey" + "x" * 60, "'bad\\nkey" + "x" * 33 + "'...")):
        rec = write_json(workdir / "e.json", {**event(1), key: CANARY})
        proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
        assert proc.returncode == 65 and shown in proc.stderr, proc.stderr
        assert CANARY not in proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1
    privacy = " ".join((ROOT / "docs/explanation/privacy.md").read_text().split())
    assert "name the field, never its value" in privacy and "never the names" not in privacy
    reference = " ".join((ROOT / "docs/reference/configuration.md").read_text().split())
    assert "An unexpected field is named in the rejection" in reference
