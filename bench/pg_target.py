"""Delivery into the PostgreSQL table target (issue 29): runner at the default batch size
against a bare asyncpg loop running the same ``INSERT … ON CONFLICT`` batches into a table
of the same shape (the floor), in paired rounds so both see the same machine weather.

    python -m bench pg-target           # full: 10,000 leads, 5 rounds; writes
                                        # bench/results/pg-target-<UTC>.json
    python -m bench pg-target --quick   # 2,000 leads, 2 rounds (writes nothing)

Each round measures, one after the other, each into a fresh table:

* **runner, in process**: ``DurableWorker.run_cycle()`` over N prepared leads in a SQLite
  store, the target ``PgTableTarget`` (its table made before the clock starts, as the
  floor's; its checks, which connect its session, made before the clock starts, as the
  floor connects before its own): the clock runs around the whole cycle (the worker
  lock, recovery, dispatch: per batch one store statement, one INSERT that answers with
  the batch's rows as stored (so no readback), and the last outcomes' statement), and
  the time of each step is summed (``_timing``: where the time goes);
* **the floor**: one asyncpg connection (made before the clock starts), and per batch the
  six column arrays built from the records and the same ``INSERT … SELECT * FROM
  unnest(…) ON CONFLICT (write_id) DO NOTHING``; nothing else;
* **the floor with readback**: the same, each batch followed by the same ``SELECT … WHERE
  write_id = ANY($1)`` runner reads back with when a write does not answer with its rows;
* **the adapter alone**: ``PgTableTarget.write_batch`` per batch (its statement answers
  with the batch's rows; a batch whose answer did not cover it would be read back, as
  runner does), called from a plain thread with no runner around it (its session made
  before the clock): its distance from the floor is the adapter's own cost;
* **what a mark costs a batch** (issue 30: the mark's row lock, its check, the rows and
  the new mark in one transaction, as runner writes to a target that keeps marks): one
  adapter writing a plain batch and a marked one, in pairs, each write timed alone
  (``mark_cost``; ``mark_ms_per_batch``: the median of the pairs' differences, beside
  ``adapter_ms_per_batch``, the median plain write);
* **runner in process, PostgreSQL store**: the same cycle with the store in a schema of
  the target's own database (the common case);
* **runner as a process**: ``python run.py once --target postgresql://… --target-table
  …`` over N prepared leads, from spawn to exit (interpreter start-up, imports, opening
  the store, creating the table, the poll pass of 100 included), and its dispatch span
  from its own log (first ``batch.in_flight`` to last ``batch.confirmed``);
* **runner's store steps alone**: the SQLite store's one statement per batch as dispatch
  makes it, with no target (``bench.http_target.store_alone``): runner's ceiling.

The server is the benchmark PostgreSQL (``RUNNER_BENCH_PG_DSN``, default the test server
on 127.0.0.1:5432, database ``test``); every table is made in a schema of the run's own,
dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from bench.common import SCOPE, machine, workdir
from bench.leads import _prepare, once_rates
from bench.results import record
from runner.leads.models import CRMRecord
from runner.limits import DEFAULT_BATCH_SIZE

PG_DSN = os.environ.get("RUNNER_BENCH_PG_DSN", "postgresql://root@127.0.0.1:5432/test")

#: the table target's own DDL (its queries.sql), so the floor writes into runner's shape
_DDL = "create_table"


def _sql(name: str, table: str) -> str:
    """One of the table target's own statements (its queries.sql), for ``table``."""
    from runner.io.engine.queries import load

    return load("runner.io.targets.pgtable")[name].numbered().replace("{t}", table)


def _records(n: int, tag: str) -> list[tuple[CRMRecord, str]]:
    return [(CRMRecord(tenant=SCOPE["tenant_id"], source="meta",
                       source_lead_id=f"lead-{i:08d}", is_test=True,
                       contact_alias=f"alias-{i}"), f"{tag}-{i:08d}") for i in range(n)]


async def _run(sql: str) -> None:
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _make_table(schema: str, table: str) -> None:
    asyncio.run(_run(_sql(_DDL, f'"{schema}"."{table}"')))


def _schema(action: str, name: str) -> None:
    asyncio.run(_run(f'{action} SCHEMA "{name}"' + (" CASCADE" if action == "DROP" else "")))


async def _floor(schema: str, table: str, n: int, batch: int, tag: str, *,
                 read: bool) -> float:
    """The bare asyncpg loop: leads per second."""
    ident = f'"{schema}"."{table}"'
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(_sql(_DDL, ident))
        insert, select = _sql("insert_rows", ident), _sql("read_rows", ident)
        items = _records(n, tag)
        batches = [items[i : i + batch] for i in range(0, n, batch)]
        started = time.perf_counter()
        for chunk in batches:
            ids = [w for _, w in chunk]
            await conn.execute(insert, ids, [r.tenant for r, _ in chunk],
                               [r.source for r, _ in chunk],
                               [r.source_lead_id for r, _ in chunk],
                               [r.is_test for r, _ in chunk],
                               [r.contact_alias for r, _ in chunk])
            if read:
                await conn.fetch(select, ids)
        return n / (time.perf_counter() - started)
    finally:
        await conn.close()


def floor(schema: str, table: str, n: int, batch: int, tag: str, *, read: bool) -> float:
    return asyncio.run(_floor(schema, table, n, batch, tag, read=read))


def adapter_alone(schema: str, table: str, n: int, batch: int, tag: str) -> float:
    """The target adapter alone, no runner: per batch its ``write_batch``, and its
    ``read_back_many`` only when the write did not answer with the batch's rows (what
    runner calls), from a plain thread; its session is made before the clock starts (its
    check).  Leads per second: the adapter's own cost is its distance from the floor."""
    from runner.io.targets.pgtable.target import PgTableTarget

    _make_table(schema, table)
    target = PgTableTarget(PG_DSN, f"{schema}.{table}")
    try:
        target.prepare_writes(True)  # adopts the table: its identity, its session
        items = _records(n, tag)
        batches = [items[i : i + batch] for i in range(0, n, batch)]
        started = time.perf_counter()
        for chunk in batches:
            if target.write_batch(chunk) is None:
                target.read_back_many([w for _, w in chunk])
        return n / (time.perf_counter() - started)
    finally:
        target.close()


def mark_cost(schema: str, table: str, pairs: int, batch: int,
              tag: str) -> tuple[float, float]:
    """What a batch mark adds to a batch's write, measured in pairs: one adapter, one
    table, a plain batch and a marked one, ``pairs`` times (each pair in the other order
    than the one before, after a pair that warms the table), each write timed alone, so
    both of a pair see the same moment of the machine (two separate runs of ten batches
    each drift apart by more than a mark costs).  Returns (the median plain write, the
    median of the pairs' differences), in milliseconds."""
    from runner.io.targets.pgtable.target import PgTableTarget
    from runner.leads.marks import BatchMark

    _make_table(schema, table)
    target = PgTableTarget(PG_DSN, f"{schema}.{table}")
    try:
        target.prepare_writes(True)
        items = _records(2 * (pairs + 1) * batch, tag)
        plain: list[float] = []
        added: list[float] = []
        for i in range(pairs + 1):  # the first pair warms the table and is not counted
            marks = [None, BatchMark(f"bench-{tag}", i + 1)]
            took: dict[bool, float] = {}
            for j, mark in enumerate(marks if i % 2 else marks[::-1]):  # either first
                chunk = items[(2 * i + j) * batch : (2 * i + j + 1) * batch]
                started = time.perf_counter()
                if target.write_batch(chunk, mark=mark) is None:
                    target.read_back_many([w for _, w in chunk])
                took[mark is not None] = (time.perf_counter() - started) * 1000
            if i:
                plain.append(took[False])
                added.append(took[True] - took[False])
        return statistics.median(plain), statistics.median(added)
    finally:
        target.close()


#: where runner's time goes, summed over the timed calls (``_timing``)
SPENT: Counter[str] = Counter()
#: when each store step and each send ran (start, end), for what ran beside what
SPANS: dict[str, list[tuple[float, float]]] = {"store step": [], "send": []}


@contextmanager
def _timing() -> Iterator[None]:
    """Sum the seconds spent in the steps of a dispatch (in whichever thread runs them):
    the store's one transaction per batch (``_batch_step``, which both the plain and the
    marked batch step run), the INSERT, the readback, and the port's whole send (mapping
    the events to records and judging the readback, around the two); and keep when each
    store step and send ran (``SPANS``): a pipelined run commits beside the send."""
    from runner.io.sqlite.delivery import BlockingDispatchSteps
    from runner.io.targets.pgtable.target import PgTableTarget
    from runner.leads.port import CRMRecordPort

    steps = [(BlockingDispatchSteps, "_batch_step", "store step"),
             (PgTableTarget, "write_batch", "INSERT"),
             (PgTableTarget, "read_back_many", "readback"),
             (CRMRecordPort, "send_batch_blocking", "send")]
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in steps]

    def timed(fn: Any, label: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                ended = time.perf_counter()
                SPENT[label] += ended - started
                if label in SPANS:
                    SPANS[label].append((started, ended))
        return call

    for cls, name, label in steps:
        setattr(cls, name, timed(getattr(cls, name), label))
    try:
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of ``spans`` ran (their union)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def runner_in_process(d: Path, schema: str, table: str, n: int, batch: int, r: int,
                      store: str | None = None) -> tuple[float, dict[str, float]]:
    """``run_cycle`` over ``n`` prepared leads in a SQLite store (``store``: that
    PostgreSQL location instead): leads per second over the whole cycle, and where the
    time went (seconds by step, ``_timing``): the store steps, and the sends in their
    parts (the INSERTs, any readback, mapping and judging), each summed; the time a store
    step and a send ran at once, counted in both; and the rest of the cycle, when
    neither ran.  So the parts less the time at once add up to the cycle."""
    from runner import DurableWorker
    from runner.io.targets.pgtable.target import PgTableTarget

    db = store or str(d / f"inproc{r}.db")
    anyio.run(_prepare, db, None, n, False)
    _make_table(schema, table)
    target = PgTableTarget(PG_DSN, f"{schema}.{table}")

    async def cycle() -> float:
        async with DurableWorker(db, SCOPE, target, batch_size=batch) as worker:
            # the target's checks connect its session, as the floor connects before its
            # clock (once per open worker; a process's first cycle does it too)
            await worker.check_target()
            SPENT.clear()
            for spans in SPANS.values():
                spans.clear()
            started = time.perf_counter()
            summary = await worker.run_cycle()
            seconds = time.perf_counter() - started
        if summary.confirmed != n:
            raise RuntimeError(f"run_cycle confirmed {summary.confirmed} of {n}")
        return seconds

    try:
        with _timing():
            seconds = anyio.run(cycle)
    finally:
        target.close()
    spent = dict(SPENT)
    send = spent.pop("send", 0.0)
    spent["mapping and judging"] = send - spent.get("INSERT", 0.0) - spent.get("readback",
                                                                                0.0)
    either = covered(SPANS["store step"] + SPANS["send"])
    # a store step beside a send (the pipelined run): time counted in both sums
    spent["store step and send at once"] = spent.get("store step", 0.0) + send - either
    spent["the rest"] = seconds - either  # neither a store step nor a send running
    spent["cycle"] = seconds
    return n / seconds, spent


def runner_process(d: Path, schema: str, table: str, n: int, batch: int,
                   r: int) -> tuple[float, float]:
    """``once`` as a process over ``n`` prepared leads: (leads per second from spawn to
    exit, leads per second over its dispatch span from its log)."""
    db = d / f"proc{r}.db"
    anyio.run(_prepare, db, None, n, False)
    scope = d / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    span, whole = once_rates(["--db", str(db), "--scope", str(scope), "--target", PG_DSN,
                              "--target-table", f"{schema}.{table}", "--batch-size",
                              str(batch)], n)
    return whole, span


def measure(n: int, rounds: int, batch: int = DEFAULT_BATCH_SIZE) -> dict[str, Any]:
    from bench.http_target import store_alone

    schema = f"bench_pgt_{os.getpid()}_{random.randrange(16**6):06x}"
    found: dict[str, list[float]] = {k: [] for k in (
        "runner", "runner_pg_store", "floor", "floor_read", "adapter",
        "once", "once_span", "store")}
    marks: list[tuple[float, float]] = []
    spent: list[dict[str, float]] = []
    stores: list[str] = []
    _schema("CREATE", schema)
    try:
        with workdir() as d:
            floor(schema, "warm", batch, batch, "warm", read=True)  # the server's caches
            for r in range(rounds):
                rate, where = runner_in_process(d, schema, f"runner{r}", n, batch, r)
                found["runner"].append(rate)
                spent.append(where)
                found["floor"].append(floor(schema, f"floor{r}", n, batch, f"f{r}",
                                            read=False))
                found["floor_read"].append(floor(schema, f"floorread{r}", n, batch,
                                                 f"g{r}", read=True))
                found["adapter"].append(adapter_alone(schema, f"adapter{r}", n, batch,
                                                      f"a{r}"))
                stores.append(f"{schema}_store{r}")
                found["runner_pg_store"].append(runner_in_process(
                    d, schema, f"pgstore{r}", n, batch, r,
                    store=f"{PG_DSN}?schema={stores[-1]}")[0])
                whole, span = runner_process(d, schema, f"once{r}", n, batch, r)
                found["once"].append(whole)
                found["once_span"].append(span)
                found["store"].append(store_alone(n, batch, d, r))
                marks.append(mark_cost(schema, f"markcost{r}", n // batch, batch, f"p{r}"))
    finally:
        for name in [schema, *stores]:
            _schema("DROP", name)

    def ratio(key: str) -> float:
        return statistics.median(x / y for x, y in zip(found[key], found["floor"],
                                                       strict=True))

    return {
        "batch_size": batch,
        **{f"{key}_per_s": statistics.median(values) for key, values in found.items()},
        "ratio": ratio("runner"),
        "pg_store_ratio": ratio("runner_pg_store"),
        "ratio_with_read": statistics.median(
            x / y for x, y in zip(found["runner"], found["floor_read"], strict=True)),
        "adapter_alone_ratio": ratio("adapter"),
        # what a batch mark adds to a batch's write, from plain and marked batches in
        # pairs (``mark_cost``): the median over the rounds of each round's median
        "mark_ms_per_batch": statistics.median(m for _, m in marks),
        "adapter_ms_per_batch": statistics.median(p for p, _ in marks),
        "once_ratio": ratio("once"),
        "once_span_ratio": ratio("once_span"),
        "store_alone_ratio": ratio("store"),
        # the median round's breakdown (by its cycle time), in seconds for n leads
        "spent": sorted(spent, key=lambda w: w["cycle"])[len(spent) // 2],
        "rounds": rounds,
        "rounds_runner_per_s": [round(x) for x in found["runner"]],
        "rounds_floor_per_s": [round(x) for x in found["floor"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pg-target",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, writes nothing")
    args = parser.parse_args(argv)
    n, rounds = (2000, 2) if args.quick else (10_000, 5)
    started = time.perf_counter()
    found = measure(n, rounds)
    seconds = time.perf_counter() - started
    print(f"PostgreSQL table target, batch size {found['batch_size']} ({n:,} leads, "
          f"{rounds} round(s); {machine()}; {seconds:.0f} s)\n")
    lines = [
        ("runner, in process (run_cycle)", "runner_per_s", "ratio", "(target >= 0.5)"),
        ("bare asyncpg, the same INSERTs", "floor_per_s", None, "(the floor)"),
        ("bare asyncpg, INSERT + readback", "floor_read_per_s", "ratio_with_read",
         "(runner's ratio to it)"),
        ("the adapter alone (its write_batch)", "adapter_per_s", "adapter_alone_ratio",
         "(its own cost)"),
        ("runner, in process, PostgreSQL store", "runner_pg_store_per_s", "pg_store_ratio",
         ""),
        ("runner once, whole process", "once_per_s", "once_ratio", "(start-up included)"),
        ("runner once, its dispatch span", "once_span_per_s", "once_span_ratio", ""),
        ("runner's store steps alone (SQLite)", "store_per_s", "store_alone_ratio",
         "(no target: runner's ceiling)"),
    ]
    for label, rate, ratio, note in lines:
        tail = f"   ratio {found[ratio]:.2f} {note}" if ratio else f"   {note}"
        print(f"{label:<38} {found[rate]:>9,.0f} leads/s{tail}")
    print(f"a batch mark adds {found['mark_ms_per_batch']:.2f} ms to a batch's write of "
          f"{found['adapter_ms_per_batch']:.2f} ms (plain and marked batches in pairs)")
    where = found["spent"]
    print(f"\nwhere runner's cycle goes ({n:,} leads, SQLite store, the median round): "
          + ", ".join(f"{k} {v * 1000:,.0f} ms" for k, v in where.items())
          + " (the parts, less the time a store step and a send ran at once, make the "
          "cycle)")
    if not args.quick:
        record("pg-target", {"n": n, "seconds": round(seconds, 1), "summary": machine(),
                             **found}, script="-m bench pg-target", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
