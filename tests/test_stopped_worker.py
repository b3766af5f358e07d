"""A worker stopped (SIGSTOP, Ctrl-Z) in the middle of a commit keeps SQLite's write lock
until it is resumed.  A second worker is still refused at once by the worker lock,
before it touches the store; an ``accept`` that meets the locked store names the stopped
process and how to resume it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from runner.io.sqlite.connection import translate
from tests.helpers import ROOT, SCOPE, event, run_cli

pytestmark = pytest.mark.timeout(60)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0]


@pytest.fixture
def stopped_worker(workdir: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    db = workdir / "queue.db"

    async def make() -> None:
        async with DurableWorker(str(db), SCOPE) as worker:
            await worker.accept(event(1))

    anyio.run(make)
    child = subprocess.Popen([sys.executable, "-m", "tests.procs.stopped_worker", str(db)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        while _state(child.pid) != "T":  # it stops itself right after saying so
            os.sched_yield()
        yield db, child
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def test_a_second_worker_is_refused_by_the_lock_before_it_touches_the_store(
        stopped_worker: tuple[Path, subprocess.Popen[str]], scope_file: Path,
        workdir: Path) -> None:
    db, child = stopped_worker
    for command in ("start", "once"):
        proc = run_cli(command, "--db", db, "--scope", scope_file, "--target",
                       workdir / "target.db", "--cycles" if command == "start" else "--poll-limit",
                       "1", timeout=25)
        assert proc.returncode == 75, proc.stderr
        assert f"another worker (pid {child.pid}) holds the lock" in proc.stderr
        assert "stayed locked" not in proc.stderr  # refused by the lock, not the store
    assert not (workdir / "target.db").exists()


def test_a_busy_store_error_names_the_stopped_worker_and_how_to_resume_it(
        stopped_worker: tuple[Path, subprocess.Popen[str]]) -> None:
    db, child = stopped_worker
    error = translate(sqlite3.OperationalError("database is locked"), "accepting a record",
                      str(db))
    assert error.exit_code == 75
    assert f"worker pid {child.pid} holds the worker lock and is stopped" in error.message
    assert f"kill -CONT {child.pid}" in error.message
    child.send_signal(signal.SIGCONT)  # resumed, the worker finishes its transaction
    child.wait(timeout=10)

    async def accept_again() -> str:
        async with DurableWorker(str(db), SCOPE) as worker:
            return (await worker.accept(event(2))).result

    assert anyio.run(accept_again) == "accepted"
    assert json.loads(run_cli("status", "--db", db).stdout)["counts"]["prepared"] == 2
