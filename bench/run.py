#!/usr/bin/env python3
"""Run every benchmark of issue 9 and print one table: figure, baseline, ratio, target.

    python -m bench            # full sizes (a few minutes); writes bench/results/bench-*.json
    python -m bench --quick    # small sizes, for CI (which runs it but does not judge it)
    python -m bench soak --minutes 30 [--backend postgres]   # the endurance run
    python -m bench batch      # the batch-size sweep (bench/batch.py)
    python -m bench ingest     # bulk accept vs the floors and PgQueuer (bench/ingest.py)
    python -m bench peers      # delivery beside huey and PgQueuer (bench/peers.py)
    python -m bench reconcile  # reconcile at scale, delivery under a quota (bench/reconcile.py)
    python -m bench http-target   # HTTP dispatch vs a bare httpx client (bench/http_target.py)
    python -m bench pg-target  # the PostgreSQL table target vs bare asyncpg (bench/pg_target.py)
    python -m bench delivery-floor  # delivery vs a batched stdlib floor (bench/delivery_floor.py)
    python -m bench delivery-scale  # delivery at 1M leads vs 100k (bench/delivery_scale.py)
    python -m bench webhook-floor  # signed webhook intake vs an ASGI floor (bench/webhook_floor.py)
    python -m bench startup    # once's start and 20k dispatch, whole process (bench/startup.py)
    python -m bench status     # status at 1M leads on both backends (bench/leads.py)
    python -m bench logcost    # dispatch with its log lines vs without (bench/logcost.py)
    python -m bench accept-scale  # accept rate at 1M leads vs at the start (bench/accept_scale.py)
    python -m bench resolve    # resolve --all vs one resolve per record (bench/resolve.py)
    python -m bench failover   # start through a kill -9 of its PostgreSQL (bench/failover.py)
    python -m bench forget     # failovers and lost stores, nothing twice (bench/forget.py)

Seeded; every ratio is against a baseline measured in the same run on the same disk.
The last line is the table as JSON; a full run (with every benchmark, not ``--only``)
also writes it, dated and with the machine, to ``bench/results/`` (``bench/results.py``),
which is where the documentation takes its figures from.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import leads, sweep, webhook
from bench.common import Row, machine, print_table
from bench.results import record
from bench.sizes import FULL, QUICK


def sweep_row(n: int) -> list[Row]:
    runner_s, same_s, bare_s, result, _ = sweep.run_once(n)
    ratio = runner_s / same_s
    return [Row(f"sweep, {n:,} candidates", runner_s * 1000, "ms", same_s * 1000, "ms",
                ratio, "<= 2", ratio <= 2,
                f"changes {result}; baseline: the plain UPDATEs of the same rows in a copy "
                f"of the same store (its triggers fire for both); on a bare table without "
                f"the schema's guarantees: {bare_s * 1000:,.0f} ms ({runner_s / bare_s:.1f}, "
                f"what they cost: bench/sweep.py --explain)")]


def soak_row() -> list[Row]:
    from bench import soak

    started = time.perf_counter()
    code = soak.main(["--quick"])
    return [Row("soak, quick (sqlite)", time.perf_counter() - started, "s", 60, "s",
                (time.perf_counter() - started) / 60, "pass", code == 0,
                "loss/duplicate audit and ceilings (bench/soak.py); full: python -m bench "
                "soak --minutes 30")]


#: ``python -m bench NAME …``: the benchmarks with a command line of their own
SUBCOMMANDS = {
    "soak": "bench.soak",      # the endurance run
    "batch": "bench.batch",    # the batch-size sweep
    "ingest": "bench.ingest",  # bulk accept against the floors and PgQueuer (issue 21)
    "reconcile": "bench.reconcile",  # reconcile at scale, delivery under a quota (issue 16)
    "http-target": "bench.http_target",  # HTTP dispatch vs a bare httpx client (issue 17)
    "pg-target": "bench.pg_target",  # the PostgreSQL table target vs bare asyncpg (issue 29)
    "delivery-floor": "bench.delivery_floor",  # delivery vs a batched floor (issue 32)
    "delivery-scale": "bench.delivery_scale",  # delivery at 1M leads vs 100k (issue 32)
    "webhook-floor": "bench.webhook_floor",  # webhook intake vs a minimal floor (issue 32)
    "startup": "bench.startup",  # the fixed cost of a run: once's start, 20k dispatch (32)
    "peers": "bench.peers",    # delivery beside huey and PgQueuer (issue 16)
    "status": "bench.leads",   # status at scale, both backends (issue 21)
    "logcost": "bench.logcost",  # the dispatch path's log lines, on and off (issue 16)
    "accept-scale": "bench.accept_scale",  # accept at 100k vs 1M leads (issue 21)
    "resolve": "bench.resolve",  # resolve --all vs one resolve per record (issue 29)
    "failover": "bench.failover",  # start through a kill -9 of its server (issue 30)
    "forget": "bench.forget",  # failovers, emptied and restored stores (issue 30 proof)
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:  # e.g. python -m bench soak --minutes 30
        import importlib

        return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--only",
                        help="comma-separated: accept,dispatch,poll,sweep,startup,scale,soak,"
                             "http")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rng = random.Random(args.seed)
    wanted = set(args.only.split(",")) if args.only else None
    plan = [
        ("accept", lambda: leads.accept(sizes["single"], sizes["bulk"], sizes["concurrent"], rng)),
        ("dispatch", lambda: leads.dispatch(sizes["dispatch"])),
        ("poll", lambda: leads.poll(1000)),
        ("sweep", lambda: sweep_row(sizes["sweep"])),
        ("startup", lambda: leads.startup()),
        ("scale", lambda: leads.scale(sizes["scale"])),
        # the endurance run: only its quick variant here (~25 s, no results file); the
        # full one is its own command, ``python -m bench soak --minutes 30``
        ("soak", soak_row),
        ("http", lambda: (webhook.intake(sizes["webhook"])
                          + webhook.metrics_scale(sizes["metrics"]))),
    ]
    rows: list[Row] = []
    started = time.perf_counter()
    for name, bench in plan:
        if wanted is None or name in wanted:
            rows += bench()
    print(f"runner benchmarks ({'quick' if args.quick else 'full'}, seed {args.seed}; "
          f"{machine()}; {time.perf_counter() - started:.0f} s)\n")
    print_table(rows)
    seconds = time.perf_counter() - started
    print(json.dumps([asdict(r) for r in rows], separators=(",", ":")))
    if not args.quick and wanted is None:
        record("bench", {"mode": "full", "seed": args.seed, "sizes": sizes,
                         "seconds": round(seconds, 1), "summary": machine(),
                         "rows": [asdict(r) for r in rows]},
               script="-m bench", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
