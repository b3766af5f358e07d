"""Hostile text at the edges: a target status no store can keep is a failed read, and a
key with control characters cannot forge or colour a text log line."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from runner.cli import main
from runner.io.synthetic_target import SyntheticTarget
from runner.logs import TextFormatter, error_line, escape
from tests.helpers import SCOPE, event, ndjson, write_json


async def _confirmed(db: str, target: Path, n: int) -> None:
    adapter = SyntheticTarget(str(target))
    async with DurableWorker(db, SCOPE, adapter) as worker:
        for i in range(n):
            await worker.accept(event(i))
        assert (await worker.run_cycle()).confirmed == n
    adapter.close()


def test_a_status_with_a_nul_is_a_failed_read_not_a_crash(
        db_location: str, workdir: Path, scope_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    target = workdir / "target.db"
    anyio.run(_confirmed, db_location, target, 2)
    common = ["--db", db_location, "--scope", str(scope_file), "--target", str(target)]
    assert main(["poll-status", *common]) == 0  # a first good read: {"status": "new"}
    conn = sqlite3.connect(target)
    conn.execute("UPDATE sheet SET status = ? WHERE source_lead_id = 'lead-1'", ("qu\x00al",))
    conn.commit()
    conn.close()
    capsys.readouterr()
    for _ in range(2):  # and again: the same failure, still no crash
        assert main(["start", *common, "--cycles", "1"]) == 0
        summary = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert summary["polled"] == 2
    assert main(["status", "--db", db_location, "--records"]) == 0
    records = {r["source_lead_id"]: r for r in ndjson(capsys.readouterr().out)}
    assert main(["status", "--db", db_location]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert records["lead-1"]["state"] == "confirmed"
    assert records["lead-1"]["snapshot"] == {"status": "new"}  # the last good read kept
    assert [(h["failure"], h["passes"], h["open"]) for h in doc["poll_health"]] == [
        ("unstorable_status", 2, True)]


def test_an_observed_snapshot_with_a_nul_is_refused(
        db_location: str, workdir: Path, scope_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    target = workdir / "target.db"
    anyio.run(_confirmed, db_location, target, 1)
    record = write_json(workdir / "e.json", event(0))
    snapshot = write_json(workdir / "s.json", {"status": "a\x00b"})
    assert main(["observe", "--db", db_location, "--scope", str(scope_file), "--record",
                 str(record), "--snapshot", str(snapshot)]) == 65
    assert "NUL" in capsys.readouterr().err


HOSTILE = "FAKE\n12:00:00 lead.confirmed       key=FAKE-LEAD\x1b[2J\x9b\u2028\u202e"


def test_a_text_log_line_escapes_control_characters_in_every_field() -> None:
    record = logging.LogRecord("runner.deliver", logging.WARNING, __file__, 1,
                               "still uncertain (%s)", (HOSTILE,), None)
    record.action = "lead.still_uncertain"
    record.key = HOSTILE
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\x9b" not in line
    assert "\u2028" not in line and "\u202e" not in line
    assert line.count("FAKE\\x0a12:00:00") == 2  # the message and the key, escaped
    assert "\\x1b[2J\\x9b\\u2028\\u202e" in line
    assert "\n" not in error_line(HOSTILE, fmt="text", reason="x")
    assert escape("plain key-1 ünïcode") == "plain key-1 ünïcode"


def test_a_hostile_key_cannot_forge_a_line_in_a_real_run(
        db_location: str, workdir: Path, scope_file: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    record = write_json(workdir / "e.json", event(1, source_lead_id=HOSTILE))
    common = ["--db", db_location, "--scope", str(scope_file)]
    assert main(["accept", *common, "--record", str(record)]) == 0
    assert main(["once", *common, "--target", str(workdir / "target.db")]) == 0
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\u2028" not in err
    assert not any(line.startswith("12:00:00") for line in err.splitlines()), err
    assert "FAKE\\x0a12:00:00" in err
