#!/usr/bin/env python3
"""Benchmark (issue 7 point 10): claim-and-complete throughput of no-op processors.

runner's side is the real thing: N inputs in D1 and a registered no-op core processor;
W worker processes each run claim -> process (no-op) -> complete rounds until the
backlog is empty, every round a batch claim under a lease (fencing token, expiry) and a
completion that checks the lease and records one durable outcome per input, all through
the store.  Measured with 1 and 4 workers, on SQLite and on PostgreSQL.

The comparisons, measured in the same run on the same disk and the same server:

* SQLite: huey's ``SqliteHuey`` consumer (thread workers) draining N no-op tasks from a
  SQLite file (WAL, the default synchronous=FULL, like runner).  huey deletes a task when
  it takes it, so a crash loses it; runner keeps every input and its outcome.
* PostgreSQL: PgQueuer consumers (W processes, batch size 10) draining N no-op jobs.

huey and PgQueuer are not project dependencies: they live in the benchmark's own
virtual environment (``bench/.venv``, from ``bench/requirements.txt``), which this script
creates on first use and re-runs itself in.

    python bench/pipeline.py              # N = 20,000, workers 1 and 4
    python bench/pipeline.py --quick      # N = 2,000 (CI: runs it, does not judge it)

A run that is not ``--quick`` (nor ``--runner-only``) also writes its rows, dated, to
``bench/results/pipeline-<UTC>.json`` (``bench/results.py``).

Enqueueing (or writing the inputs) is not timed; the clock runs from the moment every
worker process is started and ready until the last one has drained the queue.  Prints a
table and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venv"
PG_DSN = os.environ.get("RUNNER_BENCH_PG", "postgresql://root@127.0.0.1:5432/test")


def ensure_venv() -> None:
    """Re-run inside the benchmark's own environment (created on first use)."""
    if os.environ.get("RUNNER_BENCH_VENV") == "1":
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[postgres]",
                        "-r", str(ROOT / "bench" / "requirements.txt")], check=True)
    env = {**os.environ, "RUNNER_BENCH_VENV": "1"}
    os.execve(str(python), [str(python), __file__, *sys.argv[1:]], env)


# -- children: one worker process each ----------------------------------------------------


def _wait_go(go: str) -> None:
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)


def child_runner(db: str, go: str, batch: int) -> None:
    import anyio

    from bench.noop_plugin import NOOP
    from runner.clock import SystemClock
    from runner.io.stores import open_store
    from runner.pipeline.engine import Registry, WorkerSettings, run_round

    async def main() -> tuple[int, float]:
        settings = WorkerSettings(batch_size=batch, lease_seconds=60)
        registry = Registry()
        registry.register(NOOP)
        done = 0
        async with await open_store(db) as store:
            _wait_go(go)
            while True:
                result = await run_round(store, NOOP, f"bench/{os.getpid()}", settings,
                                         SystemClock())
                done += result.claimed
                if result.claimed == 0 and not (await store.backlog([NOOP.ref]))[
                        NOOP.ref.label]:
                    return done, time.time()

    done, finished = anyio.run(main)
    print(json.dumps({"done": done, "finished": finished}), flush=True)


def child_pgqueuer(dsn: str, go: str, batch: int) -> None:
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer
    from pgqueuer.types import QueueExecutionMode

    done = 0

    async def main() -> float:
        nonlocal done
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        _wait_go(go)
        await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)
        finished = time.time()
        await conn.close()
        return finished

    finished = asyncio.run(main())
    print(json.dumps({"done": done, "finished": finished}), flush=True)


def run_children(argv: list[str], workers: int, work: Path) -> tuple[float, int]:
    """Start ``workers`` children, wait until each is ready, let them go; returns
    (seconds from go to the last one done, items done)."""
    go = work / f"go-{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--go", str(go)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(workers)]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    started = time.time()
    go.touch()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        results.append(json.loads(out.splitlines()[-1]))
    return max(r["finished"] for r in results) - started, sum(r["done"] for r in results)


# -- the measurements ------------------------------------------------------------------


def runner_store_with_inputs(location: str, n: int) -> None:
    import anyio

    from bench.noop_plugin import NOOP
    from runner.io.stores import open_store
    from runner.pipeline.model import NewRecord

    async def fill() -> None:
        async with await open_store(location) as store:
            for start in range(0, n, 5000):
                records = [NewRecord(f"in:{i:09d}", {"i": i})
                           for i in range(start, min(start + 5000, n))]
                await store.ingest(records, ("bench", 1), None, None, 0)
            await store.register_processors([NOOP.ref], 0)  # puts all n in its backlog
            assert (await store.backlog([NOOP.ref]))[NOOP.ref.label] == n

    anyio.run(fill)


def bench_runner_sqlite(n: int, workers: int, batch: int, work: Path) -> dict[str, Any]:
    import sqlite3

    db = work / f"runner-{workers}.db"
    runner_store_with_inputs(str(db), n)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    seconds, done = run_children(["--child", "runner", "--db", str(db), "--batch",
                                  str(batch)], workers, work)
    assert done == n, (done, n)
    return {"seconds": seconds, "per_s": n / seconds}


def _huey(path: str) -> Any:
    from huey import SqliteHuey

    # "-nosync" files: synchronous=OFF (huey's fsync=False); others keep SQLite's default
    # FULL, as runner does
    huey = SqliteHuey("bench", filename=path, fsync=False if "-nosync" in path else None)

    @huey.task(name="noop")
    def noop() -> None:
        return None

    return huey, noop


def child_huey(path: str, go: str, workers: int, n: int) -> None:
    """A huey consumer (its main thread, as ``huey_consumer`` runs it) with thread
    workers; a watcher thread reports when the queue is drained and every task ran."""
    import logging
    import threading

    from huey.signals import SIGNAL_COMPLETE

    logging.getLogger("huey").setLevel(logging.WARNING)
    huey, _ = _huey(path)
    lock, count = threading.Lock(), [0]

    @huey.signal(SIGNAL_COMPLETE)
    def counted(signal: Any, task: Any) -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                print(json.dumps({"done": n, "finished": time.time()}), flush=True)
                os._exit(0)

    consumer = huey.create_consumer(workers=workers, worker_type="thread", periodic=False,
                                    initial_delay=0.001, max_delay=0.01,
                                    check_worker_health=False)
    _wait_go(go)
    consumer.run()


def bench_huey(n: int, workers: int, work: Path, *, fsync: bool = True) -> dict[str, Any]:
    path = str(work / f"huey-{workers}{'' if fsync else '-nosync'}.db")
    huey, noop = _huey(path)
    for _ in range(n):
        noop()
    assert huey.pending_count() == n
    seconds, done = run_children(["--child", "huey", "--db", path, "--workers",
                                  str(workers), "--n", str(n)], 1, work)
    assert done == n, (done, n)
    return {"seconds": seconds, "per_s": n / seconds}


def bench_pgqueuer(n: int, workers: int, batch: int, work: Path) -> dict[str, Any]:
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    dsn = PG_DSN

    async def prepare() -> None:
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        await conn.execute("DROP SCHEMA IF EXISTS runner_bench_pgq CASCADE")
        await conn.execute("CREATE SCHEMA runner_bench_pgq")
        await conn.execute("SET search_path = runner_bench_pgq")
        await queries.install(create_schema=False)
        for start in range(0, n, 5000):
            k = min(5000, n - start)
            await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
        await conn.close()

    asyncio.run(prepare())
    child_dsn = dsn + ("&" if "?" in dsn else "?") + "options=-c%20search_path%3Drunner_bench_pgq"
    try:
        seconds, done = run_children(["--child", "pgqueuer", "--db", child_dsn, "--batch",
                                      str(batch)], workers, work)
    finally:
        async def drop() -> None:
            conn = await asyncpg.connect(dsn)
            await conn.execute("DROP SCHEMA IF EXISTS runner_bench_pgq CASCADE")
            await conn.close()
        asyncio.run(drop())
    assert done == n, (done, n)
    return {"seconds": seconds, "per_s": n / seconds}


def bench_runner_postgres(n: int, workers: int, batch: int, work: Path
                          ) -> dict[str, Any] | None:
    try:
        import runner.io.postgres  # noqa: F401
    except ImportError:
        return None  # this build has no PostgreSQL store
    import asyncio

    import asyncpg

    schema = f"runner_bench_{workers}"
    base = PG_DSN + ("&" if "?" in PG_DSN else "?")

    async def drop() -> None:
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()

    asyncio.run(drop())
    location = f"{base}schema={schema}"
    try:
        runner_store_with_inputs(location, n)
        seconds, done = run_children(["--child", "runner", "--db", location, "--batch",
                                      str(batch)], workers, work)
    finally:
        asyncio.run(drop())
    assert done == n, (done, n)
    return {"seconds": seconds, "per_s": n / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="N = 2,000 (CI)")
    parser.add_argument("--batch", type=int, default=100, help="runner's batch size")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--runner-only", action="store_true",
                        help="measure runner alone, in this environment (no comparison)")
    parser.add_argument("--child", choices=["runner", "pgqueuer", "huey"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child == "runner":
        child_runner(args.db, args.go, args.batch)
        return 0
    if args.child == "huey":
        child_huey(args.db, args.go, args.workers, args.n)
        return 0
    if args.child == "pgqueuer":
        child_pgqueuer(args.db, args.go, args.batch)
        return 0
    if not args.runner_only:
        ensure_venv()
    n = 2000 if args.quick else args.n
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        work = Path(tmp)
        for workers in (1, 4):
            mine = bench_runner_sqlite(n, workers, args.batch, work)
            if args.runner_only:
                rows.append({"backend": "sqlite", "workers": workers, "runner": mine,
                             "baseline": "-", "other": None, "ratio": None})
                continue
            for fsync, label in ((True, "huey SqliteHuey"), (False, "huey, synchronous=OFF")):
                theirs = bench_huey(n, workers, work, fsync=fsync)
                rows.append({"backend": "sqlite", "workers": workers, "runner": mine,
                             "baseline": label, "other": theirs,
                             "ratio": mine["per_s"] / theirs["per_s"]})
        if not args.no_postgres and not args.runner_only:
            for workers in (1, 4):
                theirs = bench_pgqueuer(n, workers, 10, work)
                mine_pg = bench_runner_postgres(n, workers, args.batch, work)
                rows.append({"backend": "postgres", "workers": workers, "runner": mine_pg,
                             "baseline": "PgQueuer (batch size 10)", "other": theirs,
                             "ratio": mine_pg["per_s"] / theirs["per_s"] if mine_pg
                             else None})
    print(f"claim-and-complete of {n:,} no-op inputs (runner batch {args.batch})")
    print(f"{'backend':<9} {'workers':>7} {'runner/s':>10} {'baseline':<26} "
          f"{'other/s':>9} {'ratio':>6}")
    for row in rows:
        mine_s = f"{row['runner']['per_s']:,.0f}" if row["runner"] else "n/a"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "n/a"
        other = f"{row['other']['per_s']:,.0f}" if row["other"] else "-"
        print(f"{row['backend']:<9} {row['workers']:>7} {mine_s:>10} {row['baseline']:<26} "
              f"{other:>9} {ratio:>6}")
    print(json.dumps({"n": n, "batch": args.batch, "rows": rows}))
    if not args.quick and not args.runner_only:
        from bench.results import record

        record("pipeline", {"n": n, "batch": args.batch, "rows": rows,
                            "versions": _versions()}, script="bench/pipeline.py", argv=None)
    return 0


def _versions() -> dict[str, str]:
    from contextlib import suppress
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("huey", "pgqueuer", "asyncpg"):
        with suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


if __name__ == "__main__":
    sys.exit(main())
