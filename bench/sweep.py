#!/usr/bin/env python3
"""Benchmark: one sweepCandidates over N candidates (default 100,000) in a mix of states,
against a plain stdlib ``sqlite3`` UPDATE of the same rows, measured in the same run.

All databases are files in the same private temporary directory with the same pragmas
(WAL, ``synchronous=FULL``), hold the same rows, and are checkpointed before timing.  The
runner side is the real thing: ``Store.sweep_candidates`` through aiosqlite, with its
guarded UPDATEs, its triggers (transition table, immutability, one ``candidate_changed``
outbox event per changed row) and the last-sweep record.  The plain side is the two bare
UPDATE statements from stdlib, timed twice:

* on a copy of the same store (the target's baseline): the same rows in the same table,
  so the schema's triggers fire for both, and the ratio is what runner's sweep adds to
  the statements (a set-based sweep, not row by row: about 1.1 to 1.3);
* on a bare copy of the rows, a table without triggers, indexes or outbox: that ratio
  (about 5) is the price of the schema's guarantees, itemized by ``--explain``.

    python bench/sweep.py            # N = 100,000, median of 3 fresh runs
    python bench/sweep.py --quick    # N = 5,000, one run (CI)
    python bench/sweep.py --explain  # where the time goes: the same sweep with parts removed

``--explain`` at full size also writes its steps, dated, to
``bench/results/sweep-explain-<UTC>.json`` (``bench/results.py``); the sweep itself is
recorded by ``python -m bench``.  Prints a short report and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.results import record  # noqa: E402
from runner.candidates.rules import stuck_cutoff  # noqa: E402
from runner.clock import to_text  # noqa: E402
from runner.io.stores import open_store  # noqa: E402

T0 = datetime(2026, 8, 11, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=60)

#: bucket (i % 20) -> what the candidate is when the sweep runs
MIX = {
    **dict.fromkeys(range(0, 5), "discovered, past expires_at (T3)"),
    **dict.fromkeys(range(5, 8), "analyzing 1/2, past analysis_deadline (T4)"),
    **dict.fromkeys(range(8, 12), "analyzing 2/2, in time"),
    **dict.fromkeys(range(12, 14), "discovered, in time"),
    14: "promoting 90 s, decision recorded",
    15: "promoting 90 s, no decision",
    16: "promoting 30 s",
    **dict.fromkeys(range(17, 19), "promoted"),
    19: "expired earlier",
}


def m(minutes: float) -> str:
    return to_text(T0 + timedelta(minutes=minutes))


def plan(i: int) -> tuple[str, str, str, str, int]:
    """(id, created_at, expires_at, analysis_deadline, analyses) for candidate ``i``."""
    bucket = i % 20
    cid = f"c{bucket:02d}-{i:07d}"
    if bucket < 5 or bucket == 19:
        return cid, m(0), m(30), m(30), 0
    if bucket < 8:
        return cid, m(10), m(130), m(40), 1
    if bucket < 12:
        return cid, m(30), m(90), m(90), 2
    if bucket < 14:
        return cid, m(45), m(75), m(75), 0
    return cid, m(50), m(80), m(80), 2          # promoting / promoted


def seed(path: Path, n: int) -> None:
    """Fill the runner store through its own triggers (every row a legal history)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        rows = [plan(i) for i in range(n)]
        conn.executemany(
            "INSERT INTO candidates (id, created_at, expires_at, analysis_deadline, quorum, "
            "updated_at) VALUES (?, ?, ?, ?, 2, ?)",
            [(cid, c, e, d, c) for cid, c, e, d, _ in rows])
        conn.executemany(
            "INSERT INTO candidate_analyses (candidate_id, analyst, analyzed_at) "
            "VALUES (?, ?, ?)",
            [(cid, f"analyst-{k}", c) for cid, c, _, _, a in rows for k in range(a)])

        def ids(*buckets: int) -> list[tuple[str]]:
            return [(r[0],) for i, r in enumerate(rows) if i % 20 in buckets]

        conn.executemany("UPDATE candidates SET status = 'promoting', promotion_locked_at "
                         f"= '{to_text(NOW - timedelta(seconds=90))}' WHERE id = ?",
                         ids(14, 15, 17, 18))
        conn.executemany("UPDATE candidates SET status = 'promoting', promotion_locked_at "
                         f"= '{to_text(NOW - timedelta(seconds=30))}' WHERE id = ?",
                         ids(16))
        conn.executemany("UPDATE candidates SET decision_id = 'decision-' || id "
                         "WHERE id = ?", ids(14, 17, 18))
        conn.executemany("UPDATE candidates SET status = 'promoted' WHERE id = ?",
                         ids(17, 18))
        conn.executemany("UPDATE candidates SET status = 'expired', reason = 'T3' "
                         "WHERE id = ?", ids(19))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def plain_copy(store: Path, plain: Path) -> None:
    """The same rows in a plain table: no triggers, no indexes, no outbox."""
    conn = sqlite3.connect(plain, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(
            "CREATE TABLE candidates (seq INTEGER PRIMARY KEY, id TEXT, status TEXT, "
            "created_at TEXT, expires_at TEXT, analysis_deadline TEXT, quorum INTEGER, "
            "analyses INTEGER, promotion_locked_at TEXT, decision_id TEXT, reason TEXT, "
            "updated_at TEXT)")
        conn.execute("ATTACH DATABASE ? AS src", (str(store),))
        conn.execute("INSERT INTO candidates SELECT seq, id, status, created_at, expires_at, "
                     "analysis_deadline, quorum, analyses, promotion_locked_at, "
                     "decision_id, reason, updated_at FROM src.candidates")
        conn.execute("DETACH DATABASE src")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


async def time_runner(path: Path) -> tuple[float, dict[str, int]]:
    async with await open_store(str(path)) as store:
        started = time.perf_counter()
        result = await store.sweep_candidates(NOW)
        elapsed = time.perf_counter() - started
    return elapsed, {"expired": result["expired"], "reconciled": result["reconciled"]}


def time_plain(path: Path) -> tuple[float, dict[str, int]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = FULL")
        now, cutoff = to_text(NOW), to_text(stuck_cutoff(NOW))
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        expired = conn.execute(
            "UPDATE candidates SET status = 'expired', updated_at = ? "
            "WHERE status IN ('discovered', 'analyzing') "
            "AND (expires_at < ? OR (analysis_deadline < ? AND analyses < quorum))",
            (now, now, now)).rowcount
        reconciled = conn.execute(
            "UPDATE candidates SET status = CASE WHEN decision_id IS NOT NULL "
            "THEN 'promoted' ELSE 'rejected' END, updated_at = ? "
            "WHERE status = 'promoting' AND promotion_locked_at < ?", (now, cutoff)).rowcount
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return elapsed, {"expired": expired, "reconciled": reconciled}


def run_once(n: int) -> tuple[float, float, float, dict[str, int], float]:
    """Seed the databases afresh (a sweep changes them) and time one sweep of each:
    (runner, the plain UPDATEs on a copy of the same store, the plain UPDATEs on a bare
    copy of the rows, what changed, setup seconds)."""
    work = Path(tempfile.mkdtemp(prefix="runner-bench-"))   # mode 0700
    try:
        store, same, bare = work / "store.db", work / "same.db", work / "bare.db"

        async def create() -> None:
            async with await open_store(str(store)):
                pass

        asyncio.run(create())
        started = time.perf_counter()
        seed(store, n)  # checkpointed: the file alone is the whole store
        shutil.copy(store, same)
        plain_copy(store, bare)
        setup = time.perf_counter() - started
        runner_s, runner_result = asyncio.run(time_runner(store))
        same_s, same_result = time_plain(same)
        bare_s, bare_result = time_plain(bare)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not runner_result == same_result == bare_result:
        raise SystemExit(f"mismatch: runner {runner_result}, plain on the same store "
                         f"{same_result}, plain on a bare table {bare_result}")
    return runner_s, same_s, bare_s, runner_result, setup


#: the outbox rows sweepExpired's trigger writes, as one set-based INSERT (for --explain)
_AUDIT_EXPIRED = """
INSERT INTO outbox (kind, subject, payload, at)
SELECT 'candidate_changed', id,
       json_object('from', status, 'to', 'expired',
                   'reason', CASE WHEN expires_at < :now THEN 'T3' ELSE 'T4' END,
                   'analyses', analyses, 'quorum', quorum), :now
FROM candidates
WHERE status IN ('discovered', 'analyzing') AND analysis_deadline < :now
  AND (expires_at < :now OR analyses < quorum)
"""
_AUDIT_RECONCILED = """
INSERT INTO outbox (kind, subject, payload, at)
SELECT 'candidate_changed', id,
       json_object('from', status, 'to', CASE WHEN decision_id IS NOT NULL
                   THEN 'promoted' ELSE 'rejected' END, 'decision_id', decision_id), :now
FROM candidates WHERE status = 'promoting' AND promotion_locked_at < :cutoff
"""
_OUTBOX = ("CREATE TABLE outbox (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, subject TEXT, "
           "payload TEXT NOT NULL, at TEXT NOT NULL) STRICT")


def _timed_sweep(path: Path, statements: list[str],
                 prepare: list[str]) -> tuple[float, list[int]]:
    """One stdlib transaction of ``statements`` on ``path`` (after ``prepare``): seconds,
    and the rows each statement changed."""
    from runner.io.sqlite.base import QUERIES

    named = {"expired": QUERIES["expire_candidates"].sql,
             "reconciled": QUERIES["reconcile_stuck_promoting"].sql,
             "audit-expired": _AUDIT_EXPIRED, "audit-reconciled": _AUDIT_RECONCILED}
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = FULL")
        for sql in prepare:
            conn.execute(sql)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        params = {"now": to_text(NOW), "cutoff": to_text(stuck_cutoff(NOW))}
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        changed = [conn.execute(named[name], params).rowcount for name in statements]
        conn.execute("COMMIT")
        return time.perf_counter() - started, changed
    finally:
        conn.close()


def explain(n: int, repeat: int) -> list[tuple[str, float]]:
    """The sweep with parts of its guarantees removed, each step timed in the same run
    (medians of ``repeat`` fresh copies): what each guarantee costs, as a ratio to the
    plain UPDATEs."""
    work = Path(tempfile.mkdtemp(prefix="runner-bench-"))   # mode 0700
    try:
        store = work / "store.db"

        async def create() -> None:
            async with await open_store(str(store)):
                pass

        asyncio.run(create())
        seed(store, n)
        conn = sqlite3.connect(store)
        triggers = [f"DROP TRIGGER {name}" for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'candidates'")]
        indexes = ["DROP INDEX candidates_to_expire", "DROP INDEX candidates_promoting"]
        conn.close()
        steps: list[tuple[str, str, list[str], list[str]]] = [
            ("plain UPDATEs on a bare table", "plain", [], []),
            ("+ one audit row per change, set-based", "plain",
             ["audit-expired", "audit-reconciled"], [_OUTBOX]),
            ("runner's table (CHECKs), no triggers or indexes, set-based audit", "store",
             ["audit-expired", "audit-reconciled"], [*triggers, *indexes]),
            ("+ the sweeps' two partial indexes", "store",
             ["audit-expired", "audit-reconciled"], triggers),
            ("runner's schema: audit and guards by trigger (the real sweep)", "store", [], []),
        ]
        times: dict[str, list[float]] = {label: [] for label, *_ in steps}
        changes: set[tuple[int, int]] = set()
        for _ in range(repeat):
            for label, kind, extra, prepare in steps:
                copy = work / "copy.db"
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{copy}{suffix}").unlink(missing_ok=True)
                if kind == "plain":
                    plain_copy(store, copy)
                else:
                    shutil.copy(store, copy)
                seconds, changed = _timed_sweep(copy, [*extra, "expired", "reconciled"],
                                                prepare)
                times[label].append(seconds)
                changes.add((changed[-2], changed[-1]))
        if len(changes) != 1:  # every step must do the same work, or its time means nothing
            raise SystemExit(f"the steps changed different rows: {sorted(changes)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [(label, statistics.median(values)) for label, values in times.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100_000, help="candidates (default 100,000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="fresh runs; medians are reported (default 3)")
    parser.add_argument("--quick", action="store_true", help="N = 5,000 and one run, for CI")
    parser.add_argument("--explain", action="store_true",
                        help="time the sweep with parts of its guarantees removed")
    args = parser.parse_args(argv)
    if args.explain:
        n, repeat = (5_000, 1) if args.quick else (args.n, max(1, args.repeat))
        steps = explain(n, repeat)
        base = steps[0][1]
        print(f"{n:,} candidates, median of {repeat} run(s), stdlib sqlite3, synchronous=FULL")
        for label, seconds in steps:
            print(f"{label:64s} {seconds * 1000:8.1f} ms  {seconds / base:4.1f} x")
        if not args.quick:
            record("sweep-explain", {
                "n": n, "repeat": repeat,
                "steps": [{"step": label, "ms": round(seconds * 1000, 1),
                           "ratio": round(seconds / base, 2)} for label, seconds in steps]},
                script="bench/sweep.py", argv=argv)
        return 0
    n, repeat = (5_000, 1) if args.quick else (args.n, max(1, args.repeat))
    runs = [run_once(n) for _ in range(repeat)]
    runner_s = statistics.median(r[0] for r in runs)
    same_s = statistics.median(r[1] for r in runs)
    bare_s = statistics.median(r[2] for r in runs)
    ratio = statistics.median(r[0] / r[1] for r in runs)
    bare_ratio = statistics.median(r[0] / r[2] for r in runs)
    result = runs[0][3]
    changed = result["expired"] + result["reconciled"]
    print(f"{n:,} candidates, {changed:,} change {result}; "
          f"median of {repeat} run(s), setup {runs[0][4]:.1f} s each")
    print(f"runner sweepCandidates               {runner_s * 1000:9.1f} ms")
    print(f"plain UPDATEs, the same store        {same_s * 1000:9.1f} ms   "
          f"ratio {ratio:4.1f} x (per run: " + ", ".join(f"{r[0] / r[1]:.1f}" for r in runs)
          + ")")
    print(f"plain UPDATEs, a bare table          {bare_s * 1000:9.1f} ms   "
          f"ratio {bare_ratio:4.1f} x (what the schema's guarantees cost: --explain)")
    print(json.dumps({
        "n": n, "result": result, "runs": repeat, "runner_seconds": round(runner_s, 4),
        "plain_seconds": round(same_s, 4), "ratio": round(ratio, 2),
        "bare_seconds": round(bare_s, 4), "bare_ratio": round(bare_ratio, 2),
        "sqlite": sqlite3.sqlite_version,
    }, separators=(",", ":")))
    return 0

if __name__ == "__main__":
    sys.exit(main())
