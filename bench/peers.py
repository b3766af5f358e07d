"""Delivery side by side with the peers users would pick instead (issue 16).

    python -m bench peers                 # full: 10,000 events, 3 rounds; writes
                                          # bench/results/peers-<UTC>.json
    python -m bench peers --quick         # 2,000 events, 1 round (writes nothing)

The same work for each: N accepted events, each delivered as one row to a SQLite "sheet"
table (WAL, ``synchronous=NORMAL``, as runner's synthetic target), with completion
recorded durably by the tool's own store. Only the delivery is timed (the events are
queued beforehand, untimed), and every contender runs in this process:

* **runner** (SQLite store, and PostgreSQL store): ``DurableWorker.run_cycle`` with the
  synthetic SQLite target at the default ``--batch-size``, cycles until every record is
  confirmed; each record is marked in flight, written, read back exactly, and confirmed
  (never-twice: an ambiguous failure is resolved by readback, never by a resend);
* **huey** (``SqliteHuey``, one worker: ``dequeue`` then ``execute``, without the
  consumer's polling sleeps); its task inserts the row; the dequeue is its completion
  record (at most once: a crash between dequeue and the insert loses the row);
* **PgQueuer** (on the same PostgreSQL, in a schema of its own): ``QueueManager.run`` in
  drain mode, batches of 100; its entrypoint inserts the row; the job's deletion and log
  entry are its completion record (at least once: a crash after the insert sends again).

Peers come from the optional ``.[bench]`` extra; one that is not installed is skipped,
saying so. Rounds are interleaved; figures are medians, ratios medians of per-round ratios.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import SCOPE, accept_then_deliver, compare, comparison_main, event

PG_DSN = "postgresql://root@127.0.0.1:5432/test"


def _sheet(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS sheet (key TEXT PRIMARY KEY, body TEXT NOT NULL)")
    return conn


def _rows(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM sheet").fetchone()[0])


async def _runner(d: Path, n: int, db: str) -> float:
    from runner import DurableWorker
    from runner.io.synthetic_target import SyntheticTarget

    target = SyntheticTarget(str(d / "runner-sheet.db"))
    try:
        async with DurableWorker(db, SCOPE, target) as worker:
            return n / await accept_then_deliver(worker, n)
    finally:
        target.close()


def runner_sqlite(d: Path, n: int) -> float:
    return asyncio.run(_runner(d, n, str(d / "runner.db")))


def runner_postgres(d: Path, n: int) -> float:
    schema = "bench_peers_" + uuid.uuid4().hex[:8]
    try:
        return asyncio.run(_runner(d, n, f"{PG_DSN}?schema={schema}"))
    finally:
        asyncio.run(_drop(schema))


async def _drop(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


def huey(d: Path, n: int) -> float:
    from huey import SqliteHuey

    queue = SqliteHuey("bench", filename=str(d / "huey.db"))
    sheet = _sheet(d / "huey-sheet.db")

    @queue.task()
    def deliver(key: str, body: str) -> None:
        sheet.execute("INSERT INTO sheet (key, body) VALUES (?, ?)", (key, body))

    for i in range(n):
        ev = event(i)
        deliver(ev["source_lead_id"], json.dumps(ev))
    started = time.perf_counter()
    while (task := queue.dequeue()) is not None:
        queue.execute(task)
    elapsed = time.perf_counter() - started
    if _rows(sheet) != n:
        raise RuntimeError(f"huey delivered {_rows(sheet)} of {n}")
    sheet.close()
    return n / elapsed


async def _pgqueuer(d: Path, n: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    schema = "bench_pgq_" + uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(PG_DSN)
    await admin.execute(f"CREATE SCHEMA {schema}")
    sheet = _sheet(d / "pgq-sheet.db")
    try:
        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for start in range(0, n, 1000):
                events = [event(i) for i in range(start, min(n, start + 1000))]
                await queries.enqueue(["deliver"] * len(events),
                                      [json.dumps(ev).encode() for ev in events],
                                      [0] * len(events))
            manager = QueueManager(queries)

            @manager.entrypoint("deliver")
            async def deliver(job: Job) -> None:
                assert job.payload is not None
                body = job.payload.decode()
                sheet.execute("INSERT INTO sheet (key, body) VALUES (?, ?)",
                              (json.loads(body)["source_lead_id"], body))

            started = time.perf_counter()
            await manager.run(dequeue_timeout=timedelta(seconds=1), batch_size=100,
                              mode=QueueExecutionMode.drain)
            elapsed = time.perf_counter() - started
        finally:
            await conn.close()
        if _rows(sheet) != n:
            raise RuntimeError(f"PgQueuer delivered {_rows(sheet)} of {n}")
        return n / elapsed
    finally:
        sheet.close()
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


def pgqueuer(d: Path, n: int) -> float:
    return asyncio.run(_pgqueuer(d, n))


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def measure(n: int, rounds: int) -> dict[str, Any]:
    contenders: dict[str, Callable[[Path, int], float]] = {
        "runner, SQLite store": runner_sqlite, "runner, PostgreSQL store": runner_postgres}
    skipped = []
    for name, module, run in (("huey", "huey", huey), ("PgQueuer", "pgqueuer", pgqueuer)):
        if _installed(module):
            contenders[name] = run
        else:
            skipped.append(f"{name}: not installed (pip install -e '.[bench]')")
    return compare(contenders, n, rounds, {
        "runner SQLite / huey": ("runner, SQLite store", "huey", 1.5),
        "runner SQLite / PgQueuer": ("runner, SQLite store", "PgQueuer", 1.5),
        "runner PostgreSQL / PgQueuer": ("runner, PostgreSQL store", "PgQueuer", 1.0),
    }, skipped)


def main(argv: list[str] | None = None) -> int:
    return comparison_main(argv, "peers", "delivery", __doc__.splitlines()[0],
                           ((2_000, 1), (10_000, 3)), measure)


if __name__ == "__main__":
    sys.exit(main())
