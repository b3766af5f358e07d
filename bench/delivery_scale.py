"""Delivery at a million leads (issue 32, point 5): runner's ``once`` rate over 1,000,000
prepared leads against its rate over 100,000, on both stores, in the same run.

    python -m bench delivery-scale             # both stores, serial and pipelined,
                                               # 100,000 then 1,000,000 then 100,000;
                                               # writes bench/results/delivery-scale-<UTC>.json
    python -m bench delivery-scale --quick     # 2,000 and 20,000 leads, writes nothing
    python -m bench delivery-scale --backend sqlite --dispatch-pipeline on

Each run is ``bench.delivery_floor.runner_once``: the leads accepted beforehand into a
fresh store (``DurableWorker.accept_many``, not timed), then ``python run.py once`` to a
fresh synthetic target at the default batch size, in a child process.  The in-process
rate is over its dispatch span from its own log (first ``batch.in_flight`` line to the
last ``batch.confirmed``); the whole-process rate is from spawn to exit (start-up, the
target checks, recovery and the poll pass of a million confirmed records included).

The large run is bracketed by two small ones, and its rate is compared with their mean,
so that a machine that grows slower or faster during the run moves both sides alike (the
two small runs' spread is printed beside it).  The goal: the large run's in-process rate
at least 0.85 of the small one's (within 15%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import STORES, machine, print_header, workdir
from bench.delivery_floor import runner_once

#: the large run's rate over the small runs', at least (issue 32: within 15%)
GOAL = 0.85
SIZES = (100_000, 1_000_000)
QUICK_SIZES = (2_000, 20_000)


def measure(backend: str, pipeline: str, small: int, large: int) -> dict[str, Any]:
    """small, large, small: the rates and the large run's ratios to the small runs'
    mean."""
    runs: list[tuple[int, float, float]] = []
    started = time.perf_counter()
    for n in (small, large, small):
        with workdir() as d:
            in_process, whole_process = runner_once(d, n, backend, pipeline)
        runs.append((n, in_process, whole_process))
    small_in = [r[1] for r in runs if r[0] == small]
    small_whole = statistics.mean([r[2] for r in runs if r[0] == small])
    (big,) = [r for r in runs if r[0] == large]
    ratio_in = big[1] / statistics.mean(small_in)
    return {"backend": backend, "dispatch_pipeline": pipeline, "small": small,
            "large": large,
            "runs": [{"n": n, "in_process_per_s": round(a), "whole_process_per_s": round(b)}
                     for n, a, b in runs],
            "ratio_in_process": ratio_in,
            "ratio_whole_process": big[2] / small_whole,
            "small_spread_in_process": max(small_in) / min(small_in),
            "goal": GOAL, "met": ratio_in >= GOAL,
            "seconds": round(time.perf_counter() - started, 1)}


def print_rows(rows: list[dict[str, Any]]) -> None:
    print_header(f"{'store':<10} {'dispatch':<9} {'leads':>10} {'in process':>12} "
                 f"{'whole':>12}  {'ratio (in / whole)':<19} goal     met")
    for r in rows:
        dispatch = "pipelined" if r["dispatch_pipeline"] == "on" else "serial"
        for i, run in enumerate(r["runs"]):
            ratio = (f"{r['ratio_in_process']:.2f} / {r['ratio_whole_process']:.2f}"
                     if run["n"] == r["large"] else "")
            goal = f">= {r['goal']}" if ratio else ""
            met = ("yes" if r["met"] else "NO") if ratio else ""
            print(f"{STORES[r['backend']] if i == 0 else '':<10} "
                  f"{dispatch if i == 0 else '':<9} {run['n']:>10,} "
                  f"{run['in_process_per_s']:>10,}/s {run['whole_process_per_s']:>10,}/s  "
                  f"{ratio:<19} {goal:<8} {met}")
        print(f"{'':<10} {'':<9} the two {r['small']:,} runs differ by "
              f"{(r['small_spread_in_process'] - 1) * 100:.0f}% in process; "
              f"{r['seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    from bench.results import record

    parser = argparse.ArgumentParser(prog="python -m bench delivery-scale",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_SIZES[0]:,} and {QUICK_SIZES[1]:,} leads, writes no "
                             "results file")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--dispatch-pipeline", choices=("auto", "on", "both"),
                        default="both",
                        help="runner's --dispatch-pipeline (auto: serial on this target, "
                             "which does not deduplicate); default: both")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    small, large = QUICK_SIZES if args.quick else SIZES
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    modes = ["auto", "on"] if args.dispatch_pipeline == "both" else [args.dispatch_pipeline]
    started = time.perf_counter()
    rows = [measure(backend, mode, small, large) for backend in backends for mode in modes]
    seconds = time.perf_counter() - started
    print(f"delivery at {large:,} leads against {small:,} ({machine()}; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {seconds:.0f} s)\n")
    print_rows(rows)
    doc = {"sizes": [small, large], "goal": GOAL, "seconds": round(seconds, 1),
           "summary": machine(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not args.quick:
        record("delivery-scale", doc, script="-m bench delivery-scale", argv=argv)
    return 0 if all(r["met"] for r in rows) or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
