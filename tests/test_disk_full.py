"""A store that runs out of space (issue 8.3): no acknowledgement, no partial row, one
clear line and exit 74; after space is freed the same accept succeeds; a cycle that runs
out of space never sends a record twice.

Two ways to fill a disk, never skipped: a real 4 MiB tmpfs (the stores of every scenario
share it) in a private mount namespace (``unshare``, as root or with unprivileged user
namespaces) filled by a ballast file, and SQLite's own cap (``$RUNNER_SQLITE_MAX_PAGES``,
a test-only hook that sets ``PRAGMA max_page_count``), which is where the test falls back
to when no tmpfs can be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner import DurableWorker
from runner.errors import StoreFull
from runner.io.sqlite.connection import MAX_PAGES_ENV
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import ROOT, SCOPE, event, worker_records
from tests.procs.disk_full import SLACKS

MOUNT = 'mount -t tmpfs -o size=4m,mode=0700 tmpfs "$1" && shift && exec "$@"'


def _namespace() -> list[str] | None:
    """An ``unshare`` prefix that can mount a tmpfs here, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--mount", "--propagation", "private"],
                   ["unshare", "--user", "--map-root-user", "--mount"]):
        probe = subprocess.run([*prefix, "sh", "-c", 'mount -t tmpfs tmpfs "$1"', "sh",
                                "/mnt" if os.path.isdir("/mnt") else "/tmp"],
                               capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return prefix
    return None


def _run_scenario(workdir: Path, mode: str, slacks: list[int] | None = None
                  ) -> dict[str, Any]:
    disk, aside = workdir / "disk", workdir / "aside"
    disk.mkdir(mode=0o700)
    aside.mkdir(mode=0o700)
    child = [sys.executable, "-m", "tests.procs.disk_full", str(disk), mode, str(aside)]
    if slacks:
        child.append(",".join(map(str, slacks)))
    prefix = _namespace() if mode == "tmpfs" else None
    if mode == "tmpfs" and prefix is None:
        mode, child[4] = "pages", "pages"  # no tmpfs can be made here: SQLite's own cap
    argv = [*prefix, "sh", "-c", MOUNT, "sh", str(disk), *child] if prefix else child
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["mode"] == mode
    return report


def _check(report: dict[str, Any]) -> None:
    assert report["violations"] == []
    refused = report["refused"]
    assert refused["exit"] == 74 and refused["stdout"] == ""  # no acknowledgement
    assert len(refused["stderr"].splitlines()) == 1 and "store is full" in refused["stderr"]
    assert report["retried"] == "accepted"  # the same accept, once space is back
    failed = [c for c in report["cycles"] if c["exit"] == 74]
    assert failed and all("store is full" in c["stderr"].splitlines()[-1] for c in failed)
    assert all("Traceback" not in c["stderr"] for c in report["cycles"])


#: the default run starts cycles with three amounts of free space; ``-m slow`` all of them
#: (the in-process test below runs out of space at every commit of a cycle)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("slacks", [pytest.param([0, 40, 128], id="three"),
                                    pytest.param(SLACKS, marks=pytest.mark.slow, id="all")])
def test_a_real_full_filesystem(workdir: Path, slacks: list[int]) -> None:
    report = _run_scenario(workdir, "tmpfs", slacks)
    print("disk-full mode:", report["mode"])
    _check(report)


@pytest.mark.timeout(300)
def test_sqlite_full_through_the_cli(workdir: Path) -> None:
    _check(_run_scenario(workdir, "pages"))


async def test_a_cycle_that_runs_out_of_space_never_sends_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For growing backlogs the space runs out at a different commit of the cycle: before
    any send, at an in-flight mark, or at the outcome commit after a write."""
    seen: set[str] = set()
    for n in range(1, 41):
        work = tmp_path / f"n{n}"
        work.mkdir(mode=0o700)
        db, adapter = str(work / "q.db"), ScriptedAdapter(work / "t.db")
        async with DurableWorker(db, SCOPE) as worker:
            for i in range(n):
                await worker.accept(event(i))
        monkeypatch.setenv(MAX_PAGES_ENV, "1")  # the store may not grow any more
        try:
            async with DurableWorker(db, SCOPE, adapter) as worker:
                await worker.run_cycle()
            seen.add("no failure")
        except StoreFull:
            async with DurableWorker(db, SCOPE) as worker:
                states = {r["write_id"]: r["state"] for r in await worker_records(worker)}
            stuck = [w for w, s in states.items() if s == "in_flight"]
            seen.add("after a write" if set(stuck) & set(adapter.writes) else
                     "after an in-flight mark" if stuck else "before a send")
        monkeypatch.delenv(MAX_PAGES_ENV)
        async with DurableWorker(db, SCOPE, adapter) as worker:
            await worker.run_cycle()
            records = await worker_records(worker)
        writes = Counter(adapter.writes)
        rows = Counter(r[4] for r in sheet_rows(work / "t.db"))
        assert all(count == 1 for count in writes.values()), writes  # never sent twice
        assert all(count == 1 for count in rows.values()), rows
        for rec in records:
            assert rec["state"] == "confirmed" or (
                rec["state"] == "uncertain" and rows[rec["source_lead_id"]] == 0), rec
        if {"after a write", "before a send"} <= seen:
            break
    assert {"after a write", "before a send"} <= seen, seen


def test_a_full_postgresql_server_is_a_full_store_too() -> None:
    """PostgreSQL reports a full disk as SQLSTATE 53100 (disk_full): the same clear line and
    exit 74 as SQLite's SQLITE_FULL (the server rolled the transaction back)."""
    import asyncpg

    from runner.io.postgres.connection import translate

    exc = asyncpg.exceptions.DiskFullError(
        'could not extend file "base/16384/16385": No space left on device')
    error = translate(exc, "writing the store", "127.0.0.1:5432/test")
    assert isinstance(error, StoreFull) and error.exit_code == 74
    assert "store is full" in error.message and "\n" not in error.message
