"""The batch-size sweep of issue 16: ``once`` dispatch to the synthetic SQLite target at
several ``--batch-size`` values, each against the disk's single-row commit rate measured
around its own run, in interleaved rounds (so every size sees the same disk weather);
with the store on SQLite, then on PostgreSQL (a schema of its own on the benchmark
server; skipped, saying so, when the server cannot be reached).

    python -m bench batch                 # full: 5,000 records, 5 rounds; writes
                                          # bench/results/batch-<UTC>.json
    python -m bench batch --quick         # small, for a look (writes nothing)

The documentation renders the latest results file (``docs/hooks.py``, ``gen:results
batch``); the default batch size (``runner.limits.DEFAULT_BATCH_SIZE``) is chosen from it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench.common import machine
from bench.leads import dispatch_rate
from bench.logcost import _postgres_up
from bench.results import record

SIZES = (1, 10, 50, 100, 250, 500, 1000, 2000)
BACKENDS = ("sqlite", "postgres")


def sweep(n: int, rounds: int, sizes: tuple[int, ...] = SIZES,
          backends: tuple[str, ...] = BACKENDS) -> list[dict[str, Any]]:
    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {
        (backend, size): [] for backend in backends for size in sizes}
    for _ in range(rounds):
        for backend, size in runs:
            runs[backend, size].append(dispatch_rate(n, size, backend))
    return [{"backend": backend, "batch_size": size,
             "dispatch_per_s": statistics.median(r[0] for r in found),
             "with_startup_per_s": statistics.median(r[1] for r in found),
             "disk_commits_per_s": statistics.median(r[2] for r in found),
             "ratio": statistics.median(r[0] / r[2] for r in found)}
            for (backend, size), found in runs.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench batch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, writes nothing")
    args = parser.parse_args(argv)
    n, rounds = (500, 1) if args.quick else (5000, 5)
    started = time.perf_counter()
    backends = BACKENDS if _postgres_up() else ("sqlite",)
    if backends != BACKENDS:
        print("PostgreSQL skipped: the benchmark server cannot be reached")
    rows = sweep(n, rounds, backends=backends)
    seconds = time.perf_counter() - started
    print(f"batch-size sweep ({n:,} records, {rounds} round(s); {machine()}; {seconds:.0f} s)\n")
    print(f"{'store':>8} {'batch':>6} {'dispatch/s':>11} {'with start-up':>14} "
          f"{'disk commits/s':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['backend']:>8} {r['batch_size']:>6} {r['dispatch_per_s']:>11,.0f} "
              f"{r['with_startup_per_s']:>14,.0f} {r['disk_commits_per_s']:>15,.0f} "
              f"{r['ratio']:>6.2f}")
    if not args.quick:
        record("batch", {"n": n, "rounds": rounds, "seconds": round(seconds, 1),
                         "summary": machine(), "rows": rows},
               script="-m bench batch", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
