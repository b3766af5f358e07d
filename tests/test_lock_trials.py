"""Lock trials (issue 8.8): while a worker lives, 100 attempts of a second worker, from
other processes, are all refused with exit 75 and write nothing; once the holder is
SIGKILLed, the next worker starts at once and makes its in-flight record uncertain (and
then, reading the row back, confirmed: never sent twice).  On both backends: the flock
beside a SQLite file, and PostgreSQL's session advisory lock, which the server releases
when the killed holder's connection closes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.invariants import read_store
from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import (
    ROOT,
    Child,
    dump_db,
    event,
    last_json,
    run_cli,
    run_main,
    wait_path,
    write_json,
)

CHILDREN, EACH = 4, 25


def _content(db: str) -> object:
    """Everything a refused worker could have changed, read from outside."""
    return dump_db(Path(db)) if not pg.is_pg(db) else read_store(db)


def _history(db: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    data = read_store(db)
    moves = [(json.loads(payload)["from"], json.loads(payload)["to"])
             for _, kind, subject, payload in data["outbox"] or []
             if kind == "state_changed" and subject == "lead-1"]
    return moves, {key: attempts for key, _, _, attempts in data["records"] or []}


def _spawn_attempts(db: str, scope: Path, target: Path, go: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs.lock_attempts", str(EACH), str(db), str(scope),
         str(target), str(go)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


@pytest.mark.timeout(300)
def test_100_second_workers_refused_then_the_next_one_recovers(
    workdir: Path, scope_file: Path, db_location: str
) -> None:
    db, target, hang = db_location, workdir / "target.db", workdir / "hang"
    hang.mkdir()
    for i in (1, 2):
        rec = write_json(workdir / f"e{i}.json", event(i))
        assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                       ).returncode == 0
    holder = Child("start", "--db", db, "--scope", scope_file, "--target", target,
                   "--fault", "hang", "--interval", "3600", "--batch-size", "1",
                   # its sweeps fall on multiples of the interval of UTC time: with the
                   # default 300 s one could land between the two snapshots below
                   "--sweep-interval", "86400",
                   env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-write", holder)  # lead-1 is in flight, its row written
        holder.wait_err("sweepCandidates: expired=")  # its start-up sweep is recorded
        before, rows = _content(db), sheet_rows(target)
        go = workdir / "go"
        children = [_spawn_attempts(db, scope_file, target, go) for _ in range(CHILDREN)]
        go.touch()  # all four contend at once
        results = []
        for child in children:
            out, err = child.communicate(timeout=240)
            assert child.returncode == 0, err
            results += json.loads(out)
        assert len(results) == CHILDREN * EACH == 100
        for result in results:
            assert result["code"] == 75, result
            assert result["out"] == "" and len(result["err"].strip().splitlines()) == 1
            assert f"pid {holder.proc.pid}" in result["err"]
        cli = run_cli("once", "--db", db, "--scope", scope_file, "--target", target)
        assert cli.returncode == 75 and cli.stdout == ""  # and through a fresh process
        assert _content(db) == before and sheet_rows(target) == rows  # nothing written
        assert holder.proc.poll() is None  # the holder never noticed
        holder.proc.kill()  # SIGKILL: no cleanup, the kernel drops the flock
        holder.proc.wait(timeout=30)
    finally:
        (hang / "release").touch()
        holder.kill()
    nxt = run_main("once", "--db", db, "--scope", scope_file, "--target", target)
    assert nxt.returncode == 0, nxt.stderr
    summary = last_json(nxt.stdout)
    assert (summary["recovered"], summary["reconciled"], summary["confirmed"]) == (1, 1, 1)
    history, attempts = _history(db)
    assert history == [
        ("prepared", "in_flight"), ("in_flight", "uncertain"), ("uncertain", "confirmed")]
    assert attempts == {"lead-1": 1, "lead-2": 1}
    assert sorted(r[4] for r in sheet_rows(target)) == ["lead-1", "lead-2"]
