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
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
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


def compiled_env(cache: Path) -> dict[str, str]:
    """A child's environment with its bytecode written and read, in a cache of its own, as
    an installed package has it (pip compiles what it installs, and Python caches what it
    imports): this environment sets ``PYTHONDONTWRITEBYTECODE``, under which runner's own
    sources (an editable install) would be compiled again at every start."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


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


#: the stores' names as the printed tables give them
STORES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def print_header(header: str) -> None:
    """A printed table's header line and its rule."""
    print(header)
    print("-" * len(header))


def print_table(rows: list[Row]) -> None:
    print_header(f"{'benchmark':<28} {'figure':>18} {'baseline':>22} {'ratio':>7}  target   met")
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


def compare(contenders: dict[str, Callable[[Path, int], float]], n: int, rounds: int,
            ratios: dict[str, tuple[str, str, float | None]],
            skipped: list[str]) -> dict[str, Any]:
    """Interleaved rounds of ``contenders`` (name -> run(workdir, n) -> rows/s), each in a
    fresh directory; the median rate of each, and each ratio (name -> (mine, other, goal
    or None)) as the median of its per-round ratios (None where ``other`` did not run)."""
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            with workdir() as d:
                rates[name].append(run(d, n))

    def ratio(mine: str, other: str) -> float | None:
        if other not in rates:
            return None
        return statistics.median(a / b for a, b in zip(rates[mine], rates[other],
                                                           strict=True))

    return {"n": n, "rounds": rounds, "skipped": skipped,
            "rates": {name: statistics.median(found) for name, found in rates.items()},
            "round_rates": rates,  # each round's, in order: how noisy the medians are
            "ratios": {name: ratio(mine, other) for name, (mine, other, _) in ratios.items()},
            "goals": {name: goal for name, (_, _, goal) in ratios.items() if goal is not None}}


def comparison_main(argv: list[str] | None, kind: str, what: str, doc_line: str,
                    sizes: tuple[tuple[int, int], tuple[int, int]],
                    measure: Callable[[int, int], dict[str, Any]]) -> int:
    """The command line of a ``compare`` benchmark: ``--quick`` (small, writes nothing), or
    the full size, recorded as ``bench/results/KIND-<UTC>.json``."""
    import argparse

    from bench.results import record

    parser = argparse.ArgumentParser(prog=f"python -m bench {kind}", description=doc_line)
    parser.add_argument("--quick", action="store_true",
                        help=f"{sizes[0][0]:,} events, one round, writes nothing")
    args = parser.parse_args(argv)
    n, rounds = sizes[0] if args.quick else sizes[1]
    started = time.perf_counter()
    doc = measure(n, rounds)
    seconds = time.perf_counter() - started
    print(f"{what}, {n:,} events, {rounds} round(s); {machine()}; {seconds:.0f} s\n")
    for name, rate in doc["rates"].items():
        print(f"  {name:<30} {rate:>10,.0f} rows/s")
    for note in doc["skipped"]:
        print(f"  skipped: {note}")
    print()
    for name, value in doc["ratios"].items():
        goal = doc["goals"].get(name)
        shown = "n/a" if value is None else f"{value:.2f}"
        verdict = "" if goal is None or value is None else (
            f"  goal >= {goal}: {'met' if value >= goal else 'NOT met'}")
        print(f"  {name:<42} {shown:>6}{verdict}")
    if args.quick:
        return 0
    if doc["skipped"]:
        # a results file is what the docs render: one without a contender would put "n/a"
        # where the last complete run's figures were
        print(f"not recorded: a full run needs every contender ({'; '.join(doc['skipped'])})",
              file=sys.stderr)
        return 1
    record(kind, {**doc, "seconds": round(seconds, 1), "summary": machine()},
           script=f"-m bench {kind}", argv=argv)
    return 0


class TargetServer:
    """``runner target-serve`` over the sheet ``store``, as a child process whose log
    goes to the file ``log`` (a pipe nobody drains would stall it); ``extra`` are its
    further options (``--quota``, ``--fault``, ...).  :meth:`stop` sends SIGTERM."""

    def __init__(self, store: Path, log: Path, *extra: str) -> None:
        self.err = open(log, "a+", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        start = self.err.tell()
        self.proc = subprocess.Popen(
            [sys.executable, RUN, "target-serve", "--listen", "127.0.0.1:0", "--store",
             str(store), "--grace", "0", *extra],
            stdout=subprocess.DEVNULL, stderr=self.err, text=True, cwd=ROOT)
        deadline = time.monotonic() + 30
        while True:
            self.err.seek(start)
            text = self.err.read()
            if "listening on port " in text:
                port = int(text.split("listening on port ", 1)[1].split()[0])
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"target-serve did not start: {text[-300:]}")
            time.sleep(0.02)  # polling a child's log for its port, with a deadline
        self.url = f"http://127.0.0.1:{port}/sheet"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.err.close()


async def accept_then_deliver(worker: Any, n: int) -> float:
    """Accept ``n`` synthetic events through a ``DurableWorker`` (untimed), then run
    cycles until every one is confirmed: the seconds the delivery took."""
    for start in range(0, n, 5000):
        await worker.accept_many([event(i) for i in range(start, min(n, start + 5000))])
    confirmed = 0
    started = time.perf_counter()
    while confirmed < n:
        summary = await worker.run_cycle()
        if not summary.confirmed:
            raise RuntimeError(f"a cycle confirmed nothing ({confirmed} of {n})")
        confirmed += summary.confirmed
    return time.perf_counter() - started
