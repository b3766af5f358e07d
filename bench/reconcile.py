"""Reconcile at scale and delivery under a quota (issue 16 points 3 and 4).

Two measurements, through the library, on the synthetic SQLite target:

1. **A cycle with 10,000 uncertain records** (a long outage: every request's answer was
   lost and nothing landed, so every readback finds no row and the records stay
   uncertain from cycle to cycle).  The cycle's target requests and its time, reading
   back one record per request (what every cycle did before point 4; ``--batch-size 1``)
   and in chunks (the default batch size: one ``read_back_many`` per chunk, one commit
   per chunk), in alternating rounds, on SQLite and on PostgreSQL.  What the pass would
   take under a quota of 60 requests a minute follows from its request count.
2. **Sustained delivery under a quota of 60 writes a minute** (``target_rate``: every
   batch write takes a token; reads have a quota of their own, as Sheets keeps them):
   batches of 100 with reads not paced, first with a target that answers every write,
   then one that also answers "rate limited" (``RateLimited``, retry-after 2 s) to one
   write in ten, seeded, then the same with reads on their own quota of 60 a minute
   (``target_read_rate``): leads confirmed per minute over a window, then every record
   delivered and counted in the target (zero duplicates required).

    python -m bench reconcile            # full: 10,000 records, 60 s windows; writes
                                         # bench/results/reconcile-<UTC>.json
    python -m bench reconcile --quick    # small, for a look (writes nothing)
"""

from __future__ import annotations

import argparse
import logging
import random
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from bench.chaos_lane import drop_postgres_schema, postgres_location
from bench.common import SCOPE, event, machine, workdir
from bench.results import record
from runner import DurableWorker
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import AmbiguousWriteError, CRMRecordPort, RateLimited, TargetRow
from runner.limits import DEFAULT_BATCH_SIZE

PG_DSN = "postgresql://root@127.0.0.1:5432/test"
QUOTA_PER_MIN = 60


class Counting:
    """The synthetic target, counting every request by kind; ``lose_answers``: a batch
    write applies nothing and its answer is lost (the outage that makes records
    uncertain); ``refuse``: the share of batch writes answered RateLimited."""

    def __init__(self, path: Path, *, lose_answers: bool = False, refuse: float = 0.0,
                 seed: int = 20261130) -> None:
        self.inner = SyntheticTarget(str(path))
        self.lose_answers, self.refuse = lose_answers, refuse
        self.rng = random.Random(seed)
        self.requests: Counter[str] = Counter()

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.write_batch([(record, write_id)])

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        self.requests["write"] += 1
        if self.lose_answers:
            raise AmbiguousWriteError("answer lost (bench outage)")
        if self.refuse and self.rng.random() < self.refuse:
            self.requests["refused"] += 1
            raise RateLimited("bench quota", retry_after=2.0)
        self.inner.write_batch(items)

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        self.requests["read"] += 1
        return self.inner.read_back(write_id)

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.requests["read"] += 1
        return self.inner.read_back_many(write_ids)

    def observe_status(self, write_ids: Sequence[str]) -> Any:
        self.requests["status"] += 1
        return self.inner.observe_status(write_ids)

    def close(self) -> None:
        self.inner.close()


@contextmanager
def location(backend: str, directory: Path, name: str) -> Iterator[str]:
    if backend == "sqlite":
        yield str(directory / f"{name}.db")
        return
    where = postgres_location(PG_DSN, f"bench_{name}_{int(time.time() * 1000) % 10**9}")
    try:
        yield where
    finally:
        drop_postgres_schema(where)


async def _uncertain_store(db: str, target: Path, n: int) -> None:
    """``n`` records made uncertain by an outage that loses every answer."""
    lost = Counting(target, lose_answers=True)
    try:
        async with DurableWorker(db, SCOPE, lost, batch_size=1000) as worker:
            for start in range(0, n, 5000):
                await worker.accept_many([event(i) for i in range(start, min(n, start + 5000))])
            summary = await worker.run_cycle()
            if summary.uncertain != n:
                raise RuntimeError(f"the outage left other states: {summary}")
    finally:
        lost.close()


async def _reconcile_cycle(db: str, target: Path, batch: int, n: int) -> tuple[int, float]:
    """One cycle over ``n`` uncertain records: (target requests, seconds)."""
    adapter = Counting(target)
    try:
        async with DurableWorker(db, SCOPE, adapter, batch_size=batch) as worker:
            await worker.status()  # opened and warm
            started = time.perf_counter()
            summary = await worker.run_cycle()
            seconds = time.perf_counter() - started
    finally:
        adapter.close()
    if summary.reconciled or summary.still_uncertain != n:
        raise RuntimeError(f"the records did not stay uncertain: {summary}")
    return sum(adapter.requests.values()), seconds


def reconcile_cost(backend: str, n: int, rounds: int) -> dict[str, Any]:
    sizes = (1, DEFAULT_BATCH_SIZE)
    found: dict[int, list[tuple[int, float]]] = {size: [] for size in sizes}
    with workdir() as directory, location(backend, directory, "reconcile") as db:
        target = directory / "target.db"
        anyio.run(_uncertain_store, db, target, n)
        for _ in range(rounds):
            for size in sizes:
                found[size].append(anyio.run(_reconcile_cycle, db, target, size, n))
    rows = []
    for size, runs in found.items():
        requests = runs[0][0]
        seconds = statistics.median(s for _, s in runs)
        rows.append({"batch_size": size, "requests": requests, "seconds": round(seconds, 3),
                     "quota_minutes": round(requests / QUOTA_PER_MIN, 1)})
    before, after = rows
    return {"backend": backend, "uncertain": n, "rounds": rounds, "rows": rows,
            "request_ratio": round(before["requests"] / after["requests"], 1),
            "time_ratio": round(before["seconds"] / after["seconds"], 1)}


class Deadline:
    """A ``SendGuard`` that stops taking new work at a monotonic deadline (the window's
    end): the batch in flight finishes, none starts after."""

    def __init__(self, at: float) -> None:
        self.at = at

    @property
    def stopping(self) -> bool:
        return time.monotonic() >= self.at

    @contextmanager
    def shield(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            yield scope


async def _quota_run(db: str, target: Path, batch: int, window: float, seed: int,
                     refuse: float, read_quota: int | None) -> dict[str, Any]:
    rate = QUOTA_PER_MIN / 60.0
    read_rate = read_quota / 60.0 if read_quota is not None else None
    # what the window can take at the write quota (one write a batch), and a fifth more
    n = int(window * rate * batch * 1.2) + batch
    adapter = Counting(target, refuse=refuse, seed=seed)
    port = CRMRecordPort(adapter)
    try:
        async with DurableWorker(db, SCOPE, port, batch_size=batch, target_rate=rate,
                                 target_read_rate=read_rate, retry_base=1.0) as worker:
            for start in range(0, n, 5000):
                await worker.accept_many([event(i) for i in range(start, min(n, start + 5000))])
            started = time.monotonic()
            guard = Deadline(started + window)
            in_window = 0
            while not guard.stopping:
                summary = await worker.run_cycle(guard=guard)
                in_window += summary.confirmed
            measured = time.monotonic() - started
            refused_in_window = adapter.requests["refused"]
            writes_in_window = adapter.requests["write"]
            reads_in_window = adapter.requests["read"] + adapter.requests["status"]
            for _ in range(10_000):  # deliver the rest
                if (await worker.status())["counts"]["confirmed"] >= n:
                    break
                await worker.run_cycle()
                await anyio.sleep(0.2)  # records refused wait out their retry-after
            doc = await worker.status()
    finally:
        adapter.close()
    conn = sqlite3.connect(target)
    try:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT write_id) FROM sheet").fetchone()
    finally:
        conn.close()
    return {"batch_size": batch, "write_quota_per_min": QUOTA_PER_MIN,
            "read_quota_per_min": read_quota, "refuse_share": refuse,
            "window_s": round(measured, 1), "accepted": n,
            "confirmed_in_window": in_window,
            "leads_per_min": round(in_window / measured * 60),
            "writes_per_min": round(writes_in_window / measured * 60, 1),
            "reads_per_min": round(reads_in_window / measured * 60, 1),
            "refused_in_window": refused_in_window,
            "confirmed": doc["counts"]["confirmed"], "rows": rows,
            "duplicated": rows - distinct, "lost": n - distinct,
            "uncertain": doc["counts"]["uncertain"]}


#: (refused share of writes, read quota per minute or None: reads not paced)
QUOTA_RUNS: tuple[tuple[float, int | None], ...] = (
    (0.0, None), (0.1, None), (0.1, QUOTA_PER_MIN))


def quota_runs(window: float, batch: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for refuse, read_quota in QUOTA_RUNS:
        with workdir() as directory:
            out.append(anyio.run(_quota_run, str(directory / "q.db"),
                                 directory / "target.db", batch, window, seed, refuse,
                                 read_quota))
    return out


def _reads(q: dict[str, Any]) -> str:
    return "not paced" if q["read_quota_per_min"] is None else f"{q['read_quota_per_min']}/min"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench reconcile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, writes nothing")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args(argv)
    # runner's log lines are made (their cost is measured) but not printed over the table
    logging.getLogger("runner").addHandler(logging.NullHandler())
    n, rounds, window = (2000, 1, 12.0) if args.quick else (10_000, 2, 60.0)
    started = time.perf_counter()
    costs = [reconcile_cost(b, n, rounds) for b in args.backends.split(",")]
    quota = quota_runs(window, 100, args.seed)
    seconds = time.perf_counter() - started
    print(f"reconcile and quota ({machine()}; {seconds:.0f} s)\n")
    print(f"a cycle with {n:,} uncertain records (median of {rounds}):")
    print(f"{'backend':>9} {'batch':>6} {'requests':>9} {'seconds':>8} {'at 60/min':>10}")
    for cost in costs:
        for r in cost["rows"]:
            print(f"{cost['backend']:>9} {r['batch_size']:>6} {r['requests']:>9,} "
                  f"{r['seconds']:>8.2f} {r['quota_minutes']:>7.1f} min")
        print(f"{'':>9} before/after: {cost['request_ratio']:g}x fewer requests, "
              f"{cost['time_ratio']:g}x less time")
    print(f"\ndelivery at {QUOTA_PER_MIN} writes/minute ({window:g} s window):")
    print(f"{'batch':>6} {'refused':>8} {'reads':>10} {'leads/min':>10} {'writes/min':>11} "
          f"{'reads/min':>10} {'refused':>8} {'lost':>5} {'duplicated':>11}")
    for q in quota:
        print(f"{q['batch_size']:>6} {q['refuse_share']:>8.0%} {_reads(q):>10} "
              f"{q['leads_per_min']:>10,} {q['writes_per_min']:>11} {q['reads_per_min']:>10} "
              f"{q['refused_in_window']:>8} {q['lost']:>5} {q['duplicated']:>11}")
    if not args.quick:
        record("reconcile", {"uncertain": n, "rounds": rounds, "window_s": window,
                             "quota_per_min": QUOTA_PER_MIN, "seconds": round(seconds, 1),
                             "summary": machine(), "costs": costs, "quota": quota},
               script="-m bench reconcile", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
