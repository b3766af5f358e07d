"""Lead benchmarks of issue 9: accept (single, bulk, concurrent), dispatch, poll,
start-up and status at scale.  Each returns rows for the table in ``bench/run.py``."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from bench.common import (
    ROOT,
    RUN,
    SCOPE,
    Row,
    compiled_env,
    event,
    python_time,
    run_child,
    stdlib_batched_inserts,
    stdlib_single_commits,
    workdir,
)
from runner import DurableWorker
from runner.io.synthetic_target import SyntheticTarget


async def _accept_rounds(db: Path, base_dir: Path, n: int, rounds: int) -> tuple[float, float]:
    """Alternate rounds of stdlib single commits and runner accepts, so that both see the
    same disk weather; returns the medians (runner/s, stdlib/s) over the rounds."""
    ours, base = [], []
    per = max(50, n // rounds)
    async with DurableWorker(str(db), SCOPE) as worker:
        await worker.accept(event(-1))  # open and warm up
        for r in range(rounds):
            base.append(stdlib_single_commits(base_dir / f"r{r}", per))
            started = time.perf_counter()
            for i in range(r * per, (r + 1) * per):
                await worker.accept(event(i))
            ours.append(per / (time.perf_counter() - started))
    ratio = statistics.median(o / b for o, b in zip(ours, base, strict=True))
    base_rate = statistics.median(base)
    return base_rate * ratio, base_rate


async def _accept_concurrent(db: Path, n: int, callers: int) -> float:
    async with DurableWorker(str(db), SCOPE) as worker:
        await worker.accept(event(-1))
        queue = list(range(n))

        async def caller() -> None:
            while queue:
                await worker.accept(event(queue.pop()))

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        return n / (time.perf_counter() - started)


def accept(n_single: int, n_bulk: int, n_concurrent: int, rng: random.Random) -> list[Row]:
    with workdir() as d:
        for r in range(10):
            (d / f"r{r}").mkdir()
        single, base_single = anyio.run(_accept_rounds, d / "single.db", d, n_single, 10)
        concurrent = anyio.run(_accept_concurrent, d / "concurrent.db", n_concurrent, 128)
        records = d / "events.ndjson"
        with records.open("w") as out:
            for i in range(n_bulk):
                out.write(json.dumps(event(i, rng)) + "\n")
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        (d / "before").mkdir()
        (d / "after").mkdir()
        before = stdlib_batched_inserts(d / "before", n_bulk, 100)
        wall, _, stdout, _ = run_child(["accept", "--db", str(d / "bulk.db"),
                                        "--scope", str(scope), "--records", str(records)])
        after = stdlib_batched_inserts(d / "after", n_bulk, 100)
        base_bulk = (before + after) / 2  # the disk's rate around the run
        answers = stdout.count(b"\n")
        if answers != n_bulk:
            raise RuntimeError(f"bulk accept answered {answers} of {n_bulk}")
        bulk = n_bulk / wall
    return [
        Row("accept, one at a time", single, "/s", base_single, "commits/s",
            single / base_single, ">= 0.6", single / base_single >= 0.6,
            "in process; baseline: stdlib single-row commits, same pragmas"),
        Row(f"accept --records ({n_bulk:,})", bulk, "/s", base_bulk, "rows/s",
            bulk / base_bulk, ">= 0.25", bulk / base_bulk >= 0.25,
            "whole CLI process; baseline: stdlib, 100 rows per transaction"),
        Row("accept, 128 concurrent", concurrent, "/s", single, "single/s",
            concurrent / single, ">= 5", concurrent / single >= 5,
            "in process, group commit; baseline: the single-accept rate above"),
    ]


async def _prepare(db: Path | str, target: Path | None, n: int, confirm: bool) -> None:
    adapter = SyntheticTarget(str(target)) if target else None
    async with DurableWorker(str(db), SCOPE, adapter) as worker:
        for start in range(0, n, 5000):
            await worker.accept_many([event(i) for i in range(start, min(n, start + 5000))])
        if confirm:
            await worker.run_cycle()
            await worker.poll(1000)  # the first observation of each record
    if adapter:
        adapter.close()


def dispatch_rate(n: int, batch_size: int | None = None,
                  backend: str = "sqlite") -> tuple[float, float, float]:
    """``once`` over ``n`` prepared records (``--batch-size``, if given): the dispatch rate
    from its own log (first send to last confirmation), the rate with process start-up,
    and the disk's stdlib single-row commit rate around the run.  ``backend``
    ``postgres``: the store is a schema of its own on the benchmark server (dropped
    after); the target is the same synthetic SQLite file either way."""
    schema = f"bench_batch_{os.getpid()}_{random.randrange(16**8):08x}"
    try:
        return _dispatch_rate(n, batch_size, None if backend == "sqlite"
                              else f"{PG_DSN}?schema={schema}")
    finally:
        if backend != "sqlite":
            _drop_schema(schema)


def _dispatch_rate(n: int, batch_size: int | None,
                   location: str | None) -> tuple[float, float, float]:
    with workdir() as d:
        (d / "before").mkdir()
        (d / "after").mkdir()
        target = d / "t.db"
        db = location or str(d / "q.db")
        anyio.run(_prepare, db, None, n, False)
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        batch = [] if batch_size is None else ["--batch-size", str(batch_size)]
        before = stdlib_single_commits(d / "before", max(300, n // 4))
        sending, whole = once_rates(["--db", str(db), "--scope", str(scope),
                                     "--target", str(target), *batch], n)
        after = stdlib_single_commits(d / "after", max(300, n // 4))
    return sending, whole, (before + after) / 2


def dispatch(n: int) -> list[Row]:
    """Dispatch one record per request (``--batch-size 1``), then at the default batch
    size, each against the disk's single-row commit rate measured around its own run."""
    from runner.limits import DEFAULT_BATCH_SIZE

    rows = []
    for size, target in ((1, 0.4), (DEFAULT_BATCH_SIZE, 5.0)):
        rate, whole, base = dispatch_rate(n, size)
        label = "one record per request" if size == 1 else f"default batch size {size}"
        rows.append(Row(f"dispatch, once ({n:,}), --batch-size {size}", rate, "/s", base,
                        "commits/s", rate / base, f">= {target:g}", rate / base >= target,
                        f"{label}; first send to last confirmation, from once's own log; "
                        f"with process start-up: {whole:,.0f}/s ({whole / base:.2f})"))
        if size == DEFAULT_BATCH_SIZE == 1:
            break
    return rows


def _log_span(stderr: bytes, first: tuple[str, ...], last: tuple[str, ...]) -> float:
    """Seconds from the first of the ``first`` actions to the last of the ``last`` ones in
    JSON logs."""
    from datetime import datetime

    starts: list[datetime] = []
    ends: list[datetime] = []
    for line in stderr.splitlines():
        doc = json.loads(line)
        if doc.get("action") in first:
            starts.append(datetime.fromisoformat(doc["ts"]))
        elif doc.get("action") in last:
            ends.append(datetime.fromisoformat(doc["ts"]))
    return (max(ends) - min(starts)).total_seconds()


def once_rates(argv: list[str], n: int) -> tuple[float, float]:
    """``python run.py once ARGV --log-format json`` over ``n`` prepared leads: (leads per
    second over its dispatch span, from its first send to its last confirmation in its
    log; leads per second from spawn to exit).  Raises unless it confirmed all ``n``."""
    wall, _, stdout, stderr = run_child(["once", *argv, "--log-format", "json"],
                                        with_stderr=True)
    confirmed = json.loads(stdout)["confirmed"]
    if confirmed != n:
        raise RuntimeError(f"once confirmed {confirmed} of {n}")
    span = _log_span(stderr, ("lead.in_flight", "batch.in_flight"),
                     ("lead.confirmed", "batch.confirmed"))
    return n / span, n / wall


async def _poll_pass(db: Path, target: Path, n: int) -> float:
    adapter = SyntheticTarget(str(target))
    async with DurableWorker(str(db), SCOPE, adapter) as worker:
        started = time.perf_counter()
        summary = await worker.poll(n)
        elapsed = time.perf_counter() - started
    adapter.close()
    if summary.unchanged != n:
        raise RuntimeError(f"poll pass: {summary}")
    return elapsed


def _stdlib_poll(db: Path, target: Path) -> float:
    queue = sqlite3.connect(db, isolation_level=None)
    sheet = sqlite3.connect(target, isolation_level=None)
    ids = [w for (w,) in queue.execute("SELECT write_id FROM leads WHERE state = 'confirmed'")]
    marks = ",".join("?" * len(ids))
    started = time.perf_counter()
    sheet.execute(f"SELECT write_id, status FROM sheet WHERE write_id IN ({marks})",
                  ids).fetchall()
    queue.execute("BEGIN IMMEDIATE")
    queue.execute(f"UPDATE leads SET last_polled_at = '2026-12-01T00:00:00.000000Z' "
                  f"WHERE write_id IN ({marks})", ids)
    queue.execute("COMMIT")
    elapsed = time.perf_counter() - started
    queue.close()
    sheet.close()
    return elapsed


def poll(n: int = 1000) -> list[Row]:
    with workdir() as d:
        db, target = d / "q.db", d / "t.db"
        anyio.run(_prepare, db, target, n, True)
        pairs = [(anyio.run(_poll_pass, db, target, n), _stdlib_poll(db, target))
                 for _ in range(7)]  # interleaved: both see the same disk weather
    ours = statistics.median(p[0] for p in pairs)
    base = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    return [Row(f"poll pass, {n:,} unchanged", ours * 1000, "ms", base * 1000, "ms",
                ratio, "<= 3", ratio <= 3,
                "baseline: one stdlib SELECT of the target rows + one UPDATE, one txn")]


def startup(repeat: int = 11) -> list[Row]:
    """``status`` on an empty store against importing its three libraries, both with
    their bytecode compiled (as an installed package has it: pip compiles what it
    installs, and Python caches what it compiles).  Both sides run with a private
    ``PYTHONPYCACHEPREFIX``, warmed once, so neither reads a cache the other lacks.  The
    note gives the same ratio with this environment's own settings, where runner's
    sources may be compiled on every start (an editable install under
    ``PYTHONDONTWRITEBYTECODE``) while the libraries' bytecode was compiled at install."""
    baseline_code = "import anyio, aiosqlite, pydantic"
    with workdir() as d:
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        db = d / "empty.db"
        anyio.run(_prepare, db, None, 0, False)
        args = ["status", "--db", str(db)]
        warm = compiled_env(d / "pycache")
        run_child(args, env=warm)                      # compile both sides once
        python_time(baseline_code, env=warm)
        pairs = [(run_child(args, env=warm)[0], python_time(baseline_code, env=warm))
                 for _ in range(repeat)]
        as_is = [(run_child(args)[0], python_time(baseline_code)) for _ in range(repeat)]
    ours = statistics.median(p[0] for p in pairs)
    base = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    cold = statistics.median(p[0] / p[1] for p in as_is)
    compiled = "off" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    return [Row("CLI start-up (status)", ours * 1000, "ms", base * 1000, "ms", ratio,
                "<= 1.5", ratio <= 1.5,
                "baseline: python -c 'import anyio, aiosqlite, pydantic'; bytecode compiled "
                f"on both sides; with this environment's bytecode cache ({compiled}): "
                f"{statistics.median(p[0] for p in as_is) * 1000:.0f} ms, ratio {cold:.2f}")]


_PEAK = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
         "p = subprocess.run([sys.executable, *sys.argv[1:]], stdout=subprocess.PIPE); "
         "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
         " p.returncode, p.stdout.count(b'\\n'), len(p.stdout))")

#: where the PostgreSQL variant runs (a schema of its own, dropped afterwards)
PG_DSN = "postgresql://root@127.0.0.1:5432/test"
#: one record in this many is made uncertain, so the bounded list is cut at scale
UNCERTAIN_EVERY = 500


def _peak(args: list[str]) -> tuple[float, float, int, int]:
    """``python run.py ARGS`` in a child: (wall seconds, peak RSS in MB, lines, bytes)."""
    out = subprocess.run([sys.executable, "-c", _PEAK, RUN, *args], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    seconds, peak_kib, code, lines, size = out.split()
    if code != "0":
        raise RuntimeError(f"{args[:2]} failed ({code})")
    return float(seconds), int(peak_kib) / 1024, int(lines), int(size)


async def _make_uncertain(db: str) -> None:
    """Every ``UNCERTAIN_EVERY``-th record becomes uncertain (prepared -> in_flight ->
    uncertain, the legal path; the schema's triggers write the events and keep counts)."""
    move = [f"UPDATE {{s}}leads SET state = 'in_flight' WHERE seq % {UNCERTAIN_EVERY} = 0",
            "UPDATE {s}leads SET state = 'uncertain' WHERE state = 'in_flight'"]
    if db.startswith("postgresql://"):
        import asyncpg

        dsn, _, schema = db.partition("?schema=")
        conn = await asyncpg.connect(dsn)
        try:
            for sql in move:
                await conn.execute(sql.format(s=f"{schema}."))
            await conn.execute(f"VACUUM ANALYZE {schema}.leads")
        finally:
            await conn.close()
        return
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for sql in move:
            conn.execute(sql.format(s=""))
    finally:
        conn.close()


async def _old_counts(db: str) -> float:
    """The baseline: what ``status`` counted before the kept counts, row by row: the leads
    by state, the outbox by kind and the raw ingestion backlog (every lead event probed
    for its D1 record), one scan each (seconds)."""
    queries = ["SELECT state, count(*) FROM {s}leads GROUP BY state",
               "SELECT kind, count(*) FROM {s}outbox GROUP BY kind",
               "SELECT count(*), min(o.seq) FROM {s}outbox o WHERE o.seq > 0"
               " AND o.kind IN ('accepted', 'state_changed', 'status_changed')"
               " AND NOT EXISTS (SELECT 1 FROM {s}pipeline_records r"
               " WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)"]
    if db.startswith("postgresql://"):
        import asyncpg

        dsn, _, schema = db.partition("?schema=")
        conn = await asyncpg.connect(dsn)
        try:
            started = time.perf_counter()
            for sql in queries:
                await conn.fetch(sql.format(s=f"{schema}."))
            return time.perf_counter() - started
        finally:
            await conn.close()
    lite = sqlite3.connect(db)
    try:
        started = time.perf_counter()
        for sql in queries:
            lite.execute(sql.format(s="")).fetchall()
        return time.perf_counter() - started
    finally:
        lite.close()


async def _store_time(db: str) -> tuple[float, dict[str, Any]]:
    """Seconds of store time for the default status document (the store opened first),
    and the document's ``uncertain`` block."""
    from runner.io.stores import open_store
    from runner.status import status_document

    async with await open_store(db, scope=None, create=False) as store:
        started = time.perf_counter()
        doc = await status_document(store)
        elapsed = time.perf_counter() - started
    block: dict[str, Any] = doc["uncertain"]
    if block["truncated"] != (block["total"] > len(block["records"])):
        raise RuntimeError("the uncertain list's truncated flag is wrong")
    return elapsed, block


def _status_once(db: str, rounds: int) -> tuple[float, float, dict[str, Any]]:
    """Store time of the default status and of the old counting scans, interleaved
    (``rounds`` pairs, medians; the first pair warms the caches and is dropped)."""
    pairs = [(anyio.run(_store_time, db), anyio.run(_old_counts, db))
             for _ in range(rounds + 1)][1:]
    return (statistics.median(p[0][0] for p in pairs), statistics.median(p[1] for p in pairs),
            pairs[-1][0][1])


def _drop_schema(schema: str) -> None:
    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await conn.close()

    anyio.run(drop)


def _scale_backend(backend: str, n: int, d: Path, rounds: int) -> list[Row]:
    import uuid

    if backend == "postgres":
        schema = "bench_status_" + uuid.uuid4().hex[:8]
        db, empty = f"{PG_DSN}?schema={schema}", f"{PG_DSN}?schema={schema}_empty"
    else:
        schema, db, empty = "", str(d / "big.db"), str(d / "empty.db")
    try:
        anyio.run(_prepare, db, None, n, False)
        anyio.run(_prepare, empty, None, 0, False)
        anyio.run(_make_uncertain, db)
        store_s, scan_s, block = _status_once(db, rounds)
        wall, peak_mb, lines, size = _peak(["status", "--db", db])
        _, empty_mb, _, _ = _peak(["status", "--db", empty])
        all_wall, all_mb, all_lines, all_size = _peak(["status", "--db", db, "--records"])
    finally:
        if schema:
            _drop_schema(schema)
            _drop_schema(schema + "_empty")
    if lines != 1 or all_lines != n:
        raise RuntimeError(f"status printed {lines} lines, --records {all_lines} (n={n})")
    cut = "truncated" if block["truncated"] else "all of them"
    return [
        Row(f"status store time, {n:,} ({backend})", store_s * 1000, "ms", scan_s * 1000,
            "ms", store_s / scan_s, "< 1 s", store_s < 1.0,
            f"default document, {block['total']:,} uncertain ({len(block['records'])} shown, "
            f"{cut}); baseline: "
            f"the scans status did before (leads by state, outbox by kind, raw backlog), "
            f"interleaved, medians of {rounds}; CLI wall {wall:.2f} s, "
            f"{size / 1024:.1f} KiB printed"),
        Row(f"status peak RSS, {n:,} ({backend})", peak_mb, "MB", empty_mb, "MB",
            peak_mb / empty_mb, "< 100 MB", peak_mb < 100,
            "baseline: the same command on an empty store of the same backend"),
        Row(f"status --records, {n:,} ({backend})", all_mb, "MB", peak_mb, "MB",
            all_mb / peak_mb, "< 100 MB", all_mb < 100,
            f"NDJSON, {all_lines:,} lines, {all_size / 2**20:,.0f} MiB in {all_wall:.1f} s; "
            f"baseline: peak RSS of the default status above (constant memory)"),
    ]


def scale(n: int, backends: tuple[str, ...] = ("sqlite", "postgres"), rounds: int = 5
          ) -> list[Row]:
    """``status`` at ``n`` leads on each backend: the default document's store time (vs
    the scans it no longer does) and peak RSS, and the full NDJSON list's peak RSS."""
    rows: list[Row] = []
    for backend in backends:
        with workdir() as d:
            rows += _scale_backend(backend, n, d, rounds)
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m bench status [--quick] [--n N] [--backend B]``: status at scale only;
    a full run writes ``bench/results/status-*.json``."""
    import argparse
    from dataclasses import asdict

    from bench.common import machine, print_table
    from bench.results import record

    parser = argparse.ArgumentParser(description="status at scale (issue 21)")
    parser.add_argument("--quick", action="store_true", help="100,000 leads, not 1,000,000")
    parser.add_argument("--n", type=int, help="leads (overrides the size)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    args = parser.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    backends = tuple(args.backend or ("sqlite", "postgres"))
    started = time.perf_counter()
    rows = scale(n, backends)
    seconds = time.perf_counter() - started
    print(f"status at scale ({n:,} leads; {machine()}; {seconds:.0f} s)\n")
    print_table(rows)
    print(json.dumps([asdict(r) for r in rows], separators=(",", ":")))
    if not args.quick and args.n is None and args.backend is None:
        record("status", {"mode": "full", "n": n, "seconds": round(seconds, 1),
                          "summary": machine(),
                          "rows": [asdict(r) for r in rows]},
               script="-m bench status", argv=argv)
    return 0
