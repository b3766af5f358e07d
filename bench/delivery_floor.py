"""Delivery against a batched floor (issue 32, point 1): runner's ``once`` at the default
batch size beside a plain script doing the durable steps the delivery contract requires,
on the same N prepared leads, into the same synthetic SQLite target, in interleaved rounds.

    python -m bench delivery-floor            # both stores, 10,000 and 100,000 leads,
                                              # 3 rounds; writes
                                              # bench/results/delivery-floor-<UTC>.json
    python -m bench delivery-floor --quick    # 2,000 leads, 1 round, writes nothing
    python -m bench delivery-floor --backend sqlite --sizes 10000 --rounds 5 --json out.json

**The floor** (``sqlite3`` for the SQLite store, asyncpg for the PostgreSQL one; the target
is always a SQLite file through ``sqlite3``) does, per batch of
``runner.limits.DEFAULT_BATCH_SIZE`` records:

1. one store transaction: take the next batch of ``prepared`` records (by the state index,
   in seq order after the last batch's, as runner pages its records: on PostgreSQL a scan
   from the start of the state would step over every dead index entry the batches before
   left), mark them ``in_flight`` (``attempts + 1``, ``updated_at``) and insert one outbox
   event per record (``state_changed``, with the payload runner's trigger writes: tenant,
   write_id, from, to, attempts, reconcile_attempts);
2. map each record's stored canonical JSON to its sheet row (``json.loads``) and write the
   batch to the target in one transaction (``BEGIN IMMEDIATE``, one ``executemany``
   ``INSERT INTO sheet``, ``COMMIT``), as ``SyntheticTarget.write_batch`` does;
3. read the batch back by write_id (``SELECT … WHERE write_id IN (…)``, 500 ids at a time,
   as the target's ``read_back_many`` does) and check that each write_id has exactly one
   row, equal to what was sent;
4. one store transaction: mark the batch ``confirmed`` and insert one outbox event per
   record.

Its store is plain: ``leads`` (a primary key, a ``(state, seq)`` index, no other index, no
constraint beyond NOT NULL, no trigger) and ``outbox`` (a primary key). The durability is
runner's: the SQLite store in WAL with ``synchronous = FULL`` (and runner's page cache),
the target file in WAL with ``synchronous = NORMAL`` (``runner.io.synthetic_target``); on
PostgreSQL the server's defaults, which runner also keeps (``synchronous_commit = on``).
The target is made as ``SyntheticTarget`` makes it (its own ``SHEET`` and ``SHEET_INDEX``).

**What the floor does not do**, and runner does: runner's store enforces every transition
with triggers (the transition guard, the outbox event written by a trigger per row, the
kept counts per state and per outbox kind), keeps a unique write_id index and a unique
(tenant, source_lead_id) index, and guards each row's update by the state it must be in;
runner takes the worker lock and runs recovery before it sends, pins the target's
identity and the scope, keeps batch marks (one ``target_mark`` row per batch at the
target, in the batch's transaction, and a (tenant, source_lead_id) index on the sheet
that marks need), maps each event through pydantic (``LeadEvent``, ``CRMRecord``), judges
each readback row by row (its failure reasons), writes two JSON log lines per batch (each
with every key of the batch), paces, and ends ``once`` with a poll pass. The floor writes
no log, checks nothing but its rows, and stops. Runner commits *fewer* store transactions:
it joins one batch's outcomes and the next batch's in-flight mark in one statement
(``finish_and_mark_batch``: N/1000 + 1 commits where the floor makes 2 N/1000).

**Runner's side**: the same N leads accepted beforehand (``DurableWorker.accept_many``,
not timed), then ``python run.py once --log-format json`` to a fresh target at the default
batch size, one child process per round. Its **in-process** rate is over its dispatch span
from its own log (first ``batch.in_flight`` line to the last ``batch.confirmed``,
``bench.leads.once_rates``); its **whole-process** rate is from spawn to exit (interpreter
start-up, imports, opening the store, target checks, recovery, the poll pass included).
The floor is timed the same two ways: from its first target write (after its first
in-flight commit, the moment runner logs its first send) to its last confirmation commit,
for the in-process ratio; and over its whole loop (the first batch's read and mark
included) for the whole-process ratio. Each ratio is the median of the rounds' ratios.

With the PostgreSQL store each side has a schema of its own on the benchmark server,
dropped after the round. A cProfile of ``once`` in process (every thread) at 10,000 leads
(quick: the quick size) says where runner's time goes (``bench.delivery_profile``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from bench.common import SCOPE, STORES, event, machine, print_header, workdir
from bench.leads import _drop_schema, _prepare, once_rates
from runner.io.sqlite.connection import CACHE_KIB
from runner.io.synthetic_target import SHEET, SHEET_INDEX
from runner.limits import DEFAULT_BATCH_SIZE

PG_DSN = os.environ.get("RUNNER_BENCH_PG_DSN", "postgresql://root@127.0.0.1:5432/test")
BATCH = DEFAULT_BATCH_SIZE
#: the issue's goals: (backend, measure) -> the least ratio, judged at GOAL_SIZE leads
GOALS = {("sqlite", "in_process"): 0.8, ("sqlite", "whole_process"): 0.7,
         ("postgres", "in_process"): 0.7}
GOAL_SIZE = 100_000
#: what each ratio compares: (measure, the floor's rate, runner's rate); ``pipelined_``:
#: runner with ``--dispatch-pipeline on`` (issue 32), judged by the same goals
MEASURES = (
    ("in_process", "floor_span_per_s", "runner_in_process_per_s"),
    ("whole_process", "floor_per_s", "runner_whole_process_per_s"),
    ("pipelined_in_process", "floor_span_per_s", "runner_pipelined_in_process_per_s"),
    ("pipelined_whole_process", "floor_per_s", "runner_pipelined_whole_process_per_s"),
)

_LEADS = ("CREATE TABLE {s}leads (seq {int} PRIMARY KEY, tenant_id TEXT NOT NULL, "
          "source_lead_id TEXT NOT NULL, canonical TEXT NOT NULL, write_id TEXT NOT NULL, "
          "state TEXT NOT NULL DEFAULT 'prepared', attempts INTEGER NOT NULL DEFAULT 0, "
          "accepted_at TEXT NOT NULL, updated_at TEXT NOT NULL)")
_STATE_INDEX = "CREATE INDEX leads_by_state ON {s}leads (state, seq)"
_OUTBOX = ("CREATE TABLE {s}outbox (seq {serial} PRIMARY KEY, kind TEXT NOT NULL, "
           "subject TEXT, payload {json} NOT NULL, at TEXT NOT NULL)")
_ROW = ("INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, "
        "contact_alias) VALUES (?, ?, ?, ?, ?, ?)")
_READ = ("SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias, status "
         "FROM sheet")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _stored(n: int) -> list[tuple[Any, ...]]:
    """The floor's N prepared leads: runner's canonical JSON of the bench's events, and
    write_ids made as runner makes them (time-ordered, 5,000 at a time as the runner side
    accepts them), so the target's write_id index sees the same ids."""
    from runner.leads.intake import new_write_ids

    at = _now()
    rows = []
    for start in range(0, n, 5000):
        ids = new_write_ids(min(5000, n - start))
        for i, write_id in enumerate(ids):
            doc = event(start + i)
            canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False)
            rows.append((doc["tenant_id"], doc["source_lead_id"], canonical, write_id, at, at))
    return rows


# -- the target: a SQLite file of the synthetic target's shape --------------------------


def _target(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")  # as runner.io.synthetic_target
    conn.execute(SHEET)
    conn.execute(SHEET_INDEX)
    return conn


def _sheet_rows(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    """(write_id, canonical) -> the sheet row a record maps to."""
    rows = []
    for write_id, canonical in batch:
        doc = json.loads(canonical)
        rows.append((write_id, doc["tenant_id"], doc["source"], doc["source_lead_id"],
                     int(doc["synthetic"]), doc.get("contact_alias")))
    return rows


def _send(target: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Steps 2 and 3: the batch in one target transaction, then its exact readback."""
    target.execute("BEGIN IMMEDIATE")
    target.executemany(_ROW, rows)
    target.execute("COMMIT")
    found: dict[str, list[tuple[Any, ...]]] = {}
    ids = [row[0] for row in rows]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for got in target.execute(f"{_READ} WHERE write_id IN ({marks}) ORDER BY row_id",
                                  chunk):
            found.setdefault(got[0], []).append(tuple(got[:6]))
    for row in rows:
        if found.get(row[0]) != [row]:
            raise RuntimeError(f"the floor's readback of {row[0]} found {found.get(row[0])}")


def _events(rows: Sequence[Any], was: str, to: str, at: str
            ) -> list[tuple[str, str, str]]:
    """One outbox event per record: (subject, payload, at); ``rows`` are (seq, write_id,
    source_lead_id, tenant_id, attempts, …)."""
    return [(r[2], json.dumps({"tenant_id": r[3], "write_id": r[1], "from": was, "to": to,
                               "attempts": r[4], "reconcile_attempts": 0}), at)
            for r in rows]


# -- the SQLite floor --------------------------------------------------------------------

_MARK = ("UPDATE leads SET state = 'in_flight', attempts = attempts + 1, updated_at = ? "
         "WHERE seq IN (SELECT seq FROM leads WHERE state = 'prepared' AND seq > ? "
         "ORDER BY seq LIMIT ?) "
         "RETURNING seq, write_id, source_lead_id, tenant_id, attempts, canonical")
_CONFIRM = ("UPDATE leads SET state = 'confirmed', updated_at = ? "
            "WHERE seq IN (SELECT value FROM json_each(?)) "
            "RETURNING seq, write_id, source_lead_id, tenant_id, attempts")
_EVENT = "INSERT INTO outbox (kind, subject, payload, at) VALUES ('state_changed', ?, ?, ?)"


def sqlite_floor(d: Path, n: int) -> tuple[float, float]:
    """The floor over a SQLite store: (leads/s over the whole loop, leads/s from the first
    send to the last confirmation)."""
    store = sqlite3.connect(d / "floor.db", isolation_level=None)
    store.execute("PRAGMA journal_mode = WAL")
    store.execute("PRAGMA synchronous = FULL")  # runner's store pragmas
    store.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    store.execute(_LEADS.format(s="", int="INTEGER"))
    store.execute(_STATE_INDEX.format(s=""))
    store.execute(_OUTBOX.format(s="", serial="INTEGER", json="TEXT"))
    store.execute("BEGIN")
    store.executemany("INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, "
                      "accepted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)", _stored(n))
    store.execute("COMMIT")
    target = _target(d / "floor-target.db")
    first_send, last = None, 0
    started = time.perf_counter()
    while True:
        at = _now()
        store.execute("BEGIN IMMEDIATE")                                   # step 1
        batch = sorted(store.execute(_MARK, (at, last, BATCH)).fetchall())
        if not batch:
            store.execute("ROLLBACK")
            break
        last = batch[-1][0]
        store.executemany(_EVENT, _events(batch, "prepared", "in_flight", at))
        store.execute("COMMIT")
        if first_send is None:
            first_send = time.perf_counter()
        _send(target, _sheet_rows([(r[1], r[5]) for r in batch]))          # steps 2, 3
        at = _now()
        store.execute("BEGIN IMMEDIATE")                                   # step 4
        done = store.execute(_CONFIRM, (at, json.dumps([r[0] for r in batch]))).fetchall()
        store.executemany(_EVENT, _events(done, "in_flight", "confirmed", at))
        store.execute("COMMIT")
        last_confirmed = time.perf_counter()
    ended = time.perf_counter()
    confirmed = store.execute("SELECT count(*) FROM leads WHERE state = 'confirmed'"
                              ).fetchone()[0]
    events = store.execute("SELECT count(*) FROM outbox").fetchone()[0]
    store.close()
    target.close()
    if confirmed != n or events != 2 * n or first_send is None:
        raise RuntimeError(f"the floor confirmed {confirmed} of {n} ({events} events)")
    return n / (ended - started), n / (last_confirmed - first_send)


# -- the PostgreSQL floor ----------------------------------------------------------------

_PG_MARK = """
WITH b AS (SELECT seq FROM {s}leads WHERE state = 'prepared' AND seq > $3
           ORDER BY seq LIMIT $2),
u AS (UPDATE {s}leads l SET state = 'in_flight', attempts = l.attempts + 1, updated_at = $1
      FROM b WHERE l.seq = b.seq
      RETURNING l.seq, l.write_id, l.source_lead_id, l.tenant_id, l.attempts, l.canonical)
SELECT * FROM u ORDER BY seq"""
_PG_CONFIRM = ("UPDATE {s}leads SET state = 'confirmed', updated_at = $1 "
               "WHERE seq = ANY($2::bigint[]) "
               "RETURNING seq, write_id, source_lead_id, tenant_id, attempts")
_PG_EVENTS = ("INSERT INTO {s}outbox (kind, subject, payload, at) SELECT 'state_changed', "
              "u.subject, u.payload::jsonb, $3 FROM unnest($1::text[], $2::text[]) "
              "AS u(subject, payload)")


async def _pg_floor(d: Path, n: int, schema: str) -> tuple[float, float]:
    import asyncpg

    s = f'"{schema}".'
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(_LEADS.format(s=s, int="bigint"))
        await conn.execute(_STATE_INDEX.format(s=s))
        await conn.execute(_OUTBOX.format(s=s, serial="bigint GENERATED ALWAYS AS IDENTITY",
                                          json="jsonb"))
        await conn.copy_records_to_table(
            "leads", schema_name=schema, records=[(i + 1, *r) for i, r in
                                                  enumerate(_stored(n))],
            columns=["seq", "tenant_id", "source_lead_id", "canonical", "write_id",
                     "accepted_at", "updated_at"])
        await conn.execute(f"VACUUM ANALYZE {s}leads")
        mark, confirm = _PG_MARK.format(s=s), _PG_CONFIRM.format(s=s)
        events = _PG_EVENTS.format(s=s)
        target = _target(d / "floor-target.db")
        first_send = last_confirmed = None
        last = 0
        started = time.perf_counter()
        while True:
            at = _now()
            async with conn.transaction():                                 # step 1
                batch = await conn.fetch(mark, at, BATCH, last)
                if batch:
                    last = batch[-1][0]
                    rows = _events(batch, "prepared", "in_flight", at)
                    await conn.execute(events, [r[0] for r in rows], [r[1] for r in rows], at)
            if not batch:
                break
            if first_send is None:
                first_send = time.perf_counter()
            _send(target, _sheet_rows([(r[1], r[5]) for r in batch]))      # steps 2, 3
            at = _now()
            async with conn.transaction():                                 # step 4
                done = await conn.fetch(confirm, at, [r[0] for r in batch])
                rows = _events(done, "in_flight", "confirmed", at)
                await conn.execute(events, [r[0] for r in rows], [r[1] for r in rows], at)
            last_confirmed = time.perf_counter()
        ended = time.perf_counter()
        target.close()
        confirmed = await conn.fetchval(f"SELECT count(*) FROM {s}leads "
                                        "WHERE state = 'confirmed'")
        written = await conn.fetchval(f"SELECT count(*) FROM {s}outbox")
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
    if confirmed != n or written != 2 * n or first_send is None or last_confirmed is None:
        raise RuntimeError(f"the floor confirmed {confirmed} of {n} ({written} events)")
    return n / (ended - started), n / (last_confirmed - first_send)


def pg_floor(d: Path, n: int) -> tuple[float, float]:
    schema = f"bench_floor_{os.getpid()}_{random.randrange(16**8):08x}"
    return anyio.run(_pg_floor, d, n, schema)


# -- runner ------------------------------------------------------------------------------


def runner_once(d: Path, n: int, backend: str, pipeline: str = "auto"
                ) -> tuple[float, float]:
    """``once`` over N prepared leads to a fresh synthetic target at the default batch
    size (``--dispatch-pipeline pipeline``: ``auto`` is serial on this target, which
    does not deduplicate): (leads/s over its dispatch span from its log, leads/s from
    spawn to exit)."""
    schema = f"bench_dfloor_{os.getpid()}_{random.randrange(16**8):08x}"
    db = str(d / "runner.db") if backend == "sqlite" else f"{PG_DSN}?schema={schema}"
    try:
        anyio.run(_prepare, db, None, n, False)
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        return once_rates(["--db", db, "--scope", str(scope), "--target",
                           str(d / "runner-t.db"), "--dispatch-pipeline", pipeline], n)
    finally:
        if backend != "sqlite":
            _drop_schema(schema)


# -- the measurement ---------------------------------------------------------------------


def measure_one(backend: str, n: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds (floor, runner, runner pipelined, floor, …) of one backend and
    size."""
    floor = sqlite_floor if backend == "sqlite" else pg_floor
    found: dict[str, list[float]] = {k: [] for k in (
        "floor_per_s", "floor_span_per_s", "runner_in_process_per_s",
        "runner_whole_process_per_s", "runner_pipelined_in_process_per_s",
        "runner_pipelined_whole_process_per_s")}
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    for _ in range(rounds):
        with workdir() as d:
            whole, span = floor(d, n)
        found["floor_per_s"].append(whole)
        found["floor_span_per_s"].append(span)
        with workdir() as d:
            in_process, whole_process = runner_once(d, n, backend)
        found["runner_in_process_per_s"].append(in_process)
        found["runner_whole_process_per_s"].append(whole_process)
        with workdir() as d:
            in_process, whole_process = runner_once(d, n, backend, "on")
        found["runner_pipelined_in_process_per_s"].append(in_process)
        found["runner_pipelined_whole_process_per_s"].append(whole_process)

    per_round = {
        measure: [a / b for a, b in zip(found[mine], found[floor_key], strict=True)]
        for measure, floor_key, mine in MEASURES}
    ratios = {m: statistics.median(values) for m, values in per_round.items()}
    goals = {m: GOALS[(backend, m.removeprefix("pipelined_"))] for m in ratios
             if (backend, m.removeprefix("pipelined_")) in GOALS}
    return {"backend": backend, "n": n, "rounds": rounds,
            **{k: statistics.median(v) for k, v in found.items()},
            "ratios": ratios, "goals": goals,
            "met": ({m: ratios[m] >= g for m, g in goals.items()} if n == GOAL_SIZE else {}),
            "round_rates": {k: [round(x) for x in v] for k, v in found.items()},
            "round_ratios": {m: [round(x, 3) for x in v] for m, v in per_round.items()},
            "seconds": round(time.perf_counter() - started, 1),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def print_rows(rows: list[dict[str, Any]]) -> None:
    print_header(f"{'store':<10} {'leads':>8} {'measure':<20} {'floor':>12} {'runner':>12} "
                 f"{'ratio':>6}  goal (at {GOAL_SIZE:,})   met")
    for r in rows:
        for key, floor_key, runner_key in MEASURES:
            measure = key.replace("pipelined_", "pipel. ").replace("_", " ")
            goal = r["goals"].get(key)
            met = r["met"].get(key)
            shown = "" if goal is None else f">= {goal}"
            verdict = "" if goal is None else ("-" if met is None else
                                               ("yes" if met else "NO"))
            print(f"{STORES[r['backend']]:<10} {r['n']:>8,} {measure:<20} "
                  f"{r[floor_key]:>10,.0f}/s {r[runner_key]:>10,.0f}/s "
                  f"{r['ratios'][key]:>6.2f}  {shown:<19} {verdict}")
        print(f"{'':<10} {'':>8} rounds {r['rounds']}, {r['seconds']:.0f} s, load "
              f"{r['load_average'][0]:.2f} -> {r['load_average'][1]:.2f}; each round's "
              "ratios, in process / whole process (serial; pipelined): " + ", ".join(
                  f"{a:.2f}/{b:.2f}" for a, b in zip(r["round_ratios"]["in_process"],
                                                     r["round_ratios"]["whole_process"],
                                                     strict=True)) + "; " + ", ".join(
                  f"{a:.2f}/{b:.2f}" for a, b in zip(
                      r["round_ratios"]["pipelined_in_process"],
                      r["round_ratios"]["pipelined_whole_process"], strict=True)))


def main(argv: list[str] | None = None) -> int:
    from bench.delivery_profile import profile_once, top_lines
    from bench.pipeline_spans import pipeline_spans, span_lines
    from bench.results import record

    parser = argparse.ArgumentParser(prog="python -m bench delivery-floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2,000 leads, one round, writes no results file")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--sizes", help="comma-separated lead counts (default 10000,100000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; quick 1)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--profile", type=Path,
                        help="where the cProfile of once goes (default: a file in the "
                             "system's temporary directory)")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the profile and the pipelined run's spans")
    args = parser.parse_args(argv)
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [2000] if args.quick else [10_000, 100_000])
    rounds = args.rounds or (1 if args.quick else 3)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    started = time.perf_counter()
    rows = [measure_one(backend, n, rounds) for backend in backends for n in sizes]
    profile: dict[str, Any] | None = None
    spans: dict[str, Any] | None = None
    if not args.no_profile:
        profile = profile_once(min(10_000, max(sizes)), args.profile)
        spans = pipeline_spans(min(GOAL_SIZE, max(sizes)), pairs=1 if args.quick else 3)
    seconds = time.perf_counter() - started
    print(f"delivery against the batched floor, batch size {BATCH} ({machine()}; load "
          f"average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; {seconds:.0f} s)\n")
    print_rows(rows)
    if profile is not None:
        print()
        print("\n".join(top_lines(profile)))
    if spans is not None:
        print()
        print("\n".join(span_lines(spans)))
    doc = {"batch_size": BATCH, "sizes": sizes, "rounds": rounds, "goal_size": GOAL_SIZE,
           "seconds": round(seconds, 1),
           "summary": machine(), "rows": rows, "profile": profile, "pipeline_spans": spans}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not args.quick:
        record("delivery-floor", doc, script="-m bench delivery-floor", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
