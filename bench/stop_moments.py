#!/usr/bin/env python3
"""A SQLite worker stopped (SIGSTOP, Ctrl-Z) at random moments of a dispatch: what does
it block?  (Issue 15, point 4.)

Each trial makes a store of prepared leads, starts ``once`` to deliver them, stops it
with SIGSTOP at a random moment of the dispatch, and then asks, while it is stopped:

* **store write-locked**: can a write transaction (``BEGIN IMMEDIATE``, what ``accept``
  needs) start within 0.2 s?  A process frozen inside a commit holds SQLite's write lock
  until it is resumed; one frozen anywhere else must not.
* **second worker**: a second ``once`` on the same store must be refused by the worker
  lock (exit 75) at once, whatever the store's state.  Its time and exit code are kept.

Then the worker is resumed and left to finish.  The fraction of stop moments that find
the store write-locked is the fraction of a dispatch's time spent inside store commits
(each record is one autocommit statement: no transaction spans a send, a readback, a
log line or a thread hop); only fewer commits per record (batches) can lower it.

    python bench/stop_moments.py [--trials 25] [--leads 1500] [--root DIR] [--record]

``--root`` runs another checkout's ``run.py`` with its own ``.venv`` (to compare before
and after a change);
``--record`` writes ``bench/results/stop-moments-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SCOPE, event
from bench.results import record

ROOT = Path(__file__).resolve().parent.parent


def _python(root: Path) -> str:
    """The checkout's own environment if it has one (an editable install of this one
    would otherwise be imported instead of ``root``'s code), else this Python."""
    own = root / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def _runner(root: Path, *args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([_python(root), str(root / "run.py"), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **kwargs)  # type: ignore[call-overload]


def _make_store(work: Path, root: Path, leads: int, offset: int) -> tuple[Path, Path, Path]:
    scope, db, records = work / "scope.json", work / "queue.db", work / "records.ndjson"
    scope.write_text(json.dumps(SCOPE), encoding="utf-8")
    records.write_text("".join(json.dumps(event(offset + i)) + "\n" for i in range(leads)),
                       encoding="utf-8")
    done = subprocess.run([_python(root), str(root / "run.py"), "accept", "--db", str(db),
                           "--scope", str(scope), "--records", str(records)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"setup failed: {done.stderr.decode()[-300:]}")
    return scope, db, work / "target.db"


def _write_locked(db: Path) -> bool:
    conn = sqlite3.connect(db, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def _dispatch_started(target: Path) -> bool:
    if not target.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=0.05)
        try:
            return bool(conn.execute("SELECT count(*) FROM sheet").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def trial(index: int, root: Path, leads: int, rng: random.Random) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="runner-stop-") as tmp:
        work = Path(tmp)
        scope, db, target = _make_store(work, root, leads, index * leads)
        common = ["--db", str(db), "--scope", str(scope), "--target", str(target)]
        worker = _runner(root, "once", *common)
        deadline = time.monotonic() + 30
        while not _dispatch_started(target) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment of the dispatch
        worker.send_signal(signal.SIGSTOP)
        try:
            locked = _write_locked(db)
            started = time.monotonic()
            second = _runner(root, "once", *common)
            try:
                code = second.wait(timeout=40)
            except subprocess.TimeoutExpired:
                second.kill()
                code = second.wait()
            second_seconds = time.monotonic() - started
        finally:
            worker.send_signal(signal.SIGCONT)
        finished = worker.wait(timeout=120)
        return {"trial": index, "write_locked": locked, "second_exit": code,
                "second_seconds": round(second_seconds, 3), "worker_exit": finished}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--leads", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose run.py is measured (default: this one)")
    parser.add_argument("--label", default="this checkout",
                        help="what the measured code is, for the results file")
    parser.add_argument("--record", action="store_true",
                        help="write bench/results/stop-moments-<UTC>.json")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows = [trial(i, args.root.resolve(), args.leads, rng) for i in range(args.trials)]
    locked = sum(1 for r in rows if r["write_locked"])
    refused_fast = sum(1 for r in rows if r["second_exit"] == 75
                       and float(str(r["second_seconds"])) < 5)
    summary = {
        "trials": len(rows), "leads": args.leads, "seed": args.seed,
        "label": args.label,
        "write_locked": locked, "write_locked_fraction": round(locked / len(rows), 3),
        "second_refused_within_5s": refused_fast,
        "second_median_seconds": round(statistics.median(
            float(str(r["second_seconds"])) for r in rows), 3),
        "second_exits": sorted({int(str(r["second_exit"])) for r in rows}),
    }
    print(json.dumps(summary))
    if args.record:
        print(record("stop-moments", {**summary, "rows": rows}, script="bench/stop_moments.py",
                     argv=argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
