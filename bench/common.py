"""Shared pieces of the benchmarks: private work directories, synthetic events, the stdlib
sqlite3 baselines measured in the same run, child processes and the result table.

Every figure is compared with a baseline measured in the same run on the same disk: on a
shared machine absolute times are noise, ratios are the signal.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.io.sqlite.connection import CACHE_KIB

ROOT = Path(__file__).resolve().parent.parent
RUN = str(ROOT / "run.py")
SCOPE = {"tenant_id": "bench-tenant", "account_id": "bench-account", "page_id": "bench-page",
         "form_id": "bench-form"}


def event(i: int, rng: random.Random | None = None) -> dict[str, Any]:
    alias = f"alias-{rng.randrange(10**9) if rng else i}"
    return {**SCOPE, "source": "meta", "source_lead_id": f"lead-{i:08d}", "synthetic": True,
            "contact_alias": alias}


@contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="runner-bench-"))  # 0700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def plain_db(path: Path) -> sqlite3.Connection:
    """A stdlib connection with runner's pragmas and a table shaped like its inbox."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")  # runner's page cache, too
    conn.execute(
        "CREATE TABLE IF NOT EXISTS leads (seq INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL,"
        " source_lead_id TEXT NOT NULL, canonical TEXT NOT NULL, write_id TEXT NOT NULL UNIQUE,"
        " accepted_at TEXT NOT NULL, UNIQUE (tenant_id, source_lead_id))"
    )
    return conn


def _row(i: int) -> tuple[str, str, str, str, str]:
    doc = event(i)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    # a random write_id, as runner allocates: the same rows, the same index behaviour
    return (SCOPE["tenant_id"], doc["source_lead_id"], text, str(uuid.uuid4()),
            "2026-11-30T00:00:00.000000Z")


_INSERT = ("INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at)"
           " VALUES (?, ?, ?, ?, ?)")


def stdlib_single_commits(directory: Path, n: int) -> float:
    """Single-row transactions per second (WAL, synchronous=FULL)."""
    conn = plain_db(directory / "baseline-single.db")
    rows = [_row(i) for i in range(n)]
    started = time.perf_counter()
    for row in rows:
        conn.execute(_INSERT, row)
    elapsed = time.perf_counter() - started
    conn.close()
    return n / elapsed


def stdlib_batched_inserts(directory: Path, n: int, per_txn: int = 100) -> float:
    """Rows per second inserted ``per_txn`` rows per transaction."""
    conn = plain_db(directory / "baseline-batched.db")
    rows = [_row(i) for i in range(n)]
    started = time.perf_counter()
    for start in range(0, n, per_txn):
        conn.execute("BEGIN")
        conn.executemany(_INSERT, rows[start : start + per_txn])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return n / elapsed


def run_child(
    args: list[str], *, stdin: bytes | None = None, with_stderr: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[float, int, bytes, bytes]:
    """Run ``python run.py ARGS``; (wall seconds, peak RSS in KiB, stdout, stderr)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, RUN, *args], input=stdin, capture_output=True,
                          check=False, cwd=ROOT, env=env)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 65):
        raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr[-500:]!r}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return elapsed, max(peak, before), proc.stdout, proc.stderr if with_stderr else b""


def python_time(code: str, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
    return time.perf_counter() - started


@dataclass
class Row:
    name: str
    figure: float
    unit: str
    baseline: float
    baseline_unit: str
    ratio: float
    target: str
    met: bool
    note: str = ""


def print_table(rows: list[Row]) -> None:
    header = f"{'benchmark':<28} {'figure':>18} {'baseline':>22} {'ratio':>7}  target   met"
    print(header)
    print("-" * len(header))
    for r in rows:
        fig = f"{r.figure:,.1f} {r.unit}"
        base = f"{r.baseline:,.1f} {r.baseline_unit}"
        mark = "yes" if r.met else "NO"
        print(f"{r.name:<28} {fig:>18} {base:>22} {r.ratio:>7.2f}  {r.target:<8} {mark}")
        if r.note:
            print(f"{'':<28} {r.note}")


def machine() -> str:
    return (f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"SQLite {sqlite3.sqlite_version}")
