"""The fixed cost of a run (issue 32, point 2): ``once`` as a whole process, paired in the
same run with what it is judged against.

    python -m bench startup            # 25 pairs, 3 rounds of 20,000 leads; writes
                                       # bench/results/startup-<UTC>.json
    python -m bench startup --quick    # 5 pairs, 1 round of 2,000 leads, writes nothing
    python -m bench startup --pairs 15 --leads 20000 --rounds 5 --json out.json

**The start** (goal: at most 0.15 s): ``python run.py once`` on a warm store (made, its
scope pinned and its target pinned by a first ``once``) with an empty backlog, beside
``python -c pass``, in N interleaved pairs; each pair's difference is what runner adds to a
bare interpreter (imports, parsing its options, opening the store and checking its
schema and scope, the target's checks, the lock and recovery, an empty cycle and poll
pass, closing).  The figure is the median of the differences, with their spread; the CPU
time the two children used (user + system, from ``getrusage``) is given beside it, being
less moved than wall time by what else runs on the machine.

**Bytecode** is compiled on both sides, as an installed package has it (pip compiles what
it installs, and Python caches what it imports): both run without
``PYTHONDONTWRITEBYTECODE`` (this environment sets it, so runner's own sources would be
compiled on every start) and with a private ``PYTHONPYCACHEPREFIX``, warmed by one run of
each before the pairs.

**Dispatch of 20,000 leads** (goal: at least 5 times the disk's single-row commit rate):
the leads accepted beforehand (``DurableWorker.accept_many``, not timed), then
``python run.py once --log-format json`` to a fresh synthetic target at the default batch
size, timed from spawn to exit.  Its baseline is the disk's single-row commit rate
(``bench.common.stdlib_single_commits``: a stdlib ``sqlite3`` loop of one ``INSERT`` and
its commit, WAL with ``synchronous = FULL`` and runner's page cache, in the same
directory), measured just before and just after the run (their mean).  The ratio is per
round; the figure is the median of the rounds'.  Beside it, where the whole process's time
went, from the run's own JSON log (its ``ts`` against the spawn time): the start up to
``target.pinned``; from there to the first send (recovery, reconcile, loading the models
and parsing the first page, the first in-flight mark); the dispatch span (first
``batch.in_flight`` to last ``batch.confirmed``, which ``bench/leads.py`` reports as the
in-process rate); and the rest to exit (the poll pass, closing the store, the
interpreter's exit).

**What the goal asks, against the floor:** in each round, between the same two commit
measures, the batched floor of ``bench.delivery_floor`` (a plain ``sqlite3`` loop of the
durable steps the contract requires per batch, with no runner, no start-up and no
interpreter of its own) delivers the same number of leads: its rate against the disk's
(``floor_ratio``), and what a whole process would reach if it delivered as fast as that
floor and started within the start goal (``floor_with_start_ratio``: the leads over the
floor's loop plus ``python -c pass`` plus the goal's 0.15 s, against the disk's rate; its
exit counted as nothing); and how much faster than the floor a dispatch would have to
be to meet the goal with the start goal met (``needed_over_floor``; above 1: faster
than the floor that point 1 judges runner's delivery against).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from bench.common import (
    ROOT,
    RUN,
    SCOPE,
    compiled_env,
    machine,
    stdlib_single_commits,
    workdir,
)
from bench.delivery_floor import sqlite_floor
from bench.leads import _prepare

#: the issue's goals: the start (seconds, at most) and the dispatch ratio (at least)
START_GOAL_S = 0.15
DISPATCH_GOAL = 5.0
LEADS = 20_000
#: the spans of a dispatch run, each from the log action it starts at (``spawn``: the
#: process start) to the one the next span starts at (``exit``: the process's end)
SPANS = (("start", "spawn", "target.pinned"),
         ("to_first_send", "target.pinned", "batch.in_flight"),
         ("dispatch", "batch.in_flight", "batch.confirmed"),
         ("to_exit", "batch.confirmed", "exit"))


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, bytes, bytes]:
    """Run ``argv`` (from the repository): (wall seconds, CPU seconds, stdout, stderr)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, cwd=ROOT, env=env, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[1:3]} failed ({proc.returncode}): {proc.stderr[-500:]!r}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout, proc.stderr


def once_argv(d: Path, *extra: str) -> list[str]:
    return [sys.executable, RUN, "once", "--db", str(d / "q.db"), "--scope",
            str(d / "scope.json"), "--target", str(d / "t.db"), *extra]


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "p25": ordered[len(ordered) // 4], "p75": ordered[(3 * len(ordered)) // 4]}


def measure_start(pairs: int, env: dict[str, str]) -> dict[str, Any]:
    """N interleaved pairs: an idle ``once`` on a warm store, then ``python -c pass``."""
    bare = [sys.executable, "-c", "pass"]
    with workdir() as d:
        (d / "scope.json").write_text(json.dumps(SCOPE))
        runs = [timed(once_argv(d), env) for _ in range(2)]  # makes, pins and warms
        if json.loads(runs[-1][2])["dispatched"] != 0:
            raise RuntimeError("the idle once dispatched something")
        timed(bare, env)
        walls: list[tuple[float, float]] = []
        cpus: list[tuple[float, float]] = []
        for _ in range(pairs):
            wall, cpu, _, _ = timed(once_argv(d), env)
            base_wall, base_cpu, _, _ = timed(bare, env)
            walls.append((wall, base_wall))
            cpus.append((cpu, base_cpu))
    diff = _spread([a - b for a, b in walls])
    return {"pairs": pairs, "once_s": statistics.median(a for a, _ in walls),
            "pass_s": statistics.median(b for _, b in walls), "difference_s": diff,
            "cpu_difference_s": _spread([a - b for a, b in cpus]),
            "goal_s": START_GOAL_S, "met": diff["median"] <= START_GOAL_S,
            "round_differences_s": [round(a - b, 4) for a, b in walls]}


def _spans(stderr: bytes, spawned: float, ended: float) -> dict[str, float]:
    """Seconds of each of ``SPANS`` in one run, from its JSON log's timestamps."""
    first: dict[str, float] = {"spawn": spawned, "exit": ended}
    last: dict[str, float] = {"spawn": spawned, "exit": ended}
    for line in stderr.splitlines():
        doc = json.loads(line)
        at = datetime.fromisoformat(doc["ts"]).timestamp()
        first.setdefault(doc.get("action", ""), at)
        last[doc.get("action", "")] = at
    # a span starts at the first line of its action and ends at the last of the next's
    # (the dispatch span: the first send to the last confirmation)
    return {name: (last[end] if name == "dispatch" else first.get(end, last[end]))
            - (last[begin] if name == "to_exit" else first[begin])
            for name, begin, end in SPANS}


def measure_dispatch(n: int, rounds: int, env: dict[str, str],
                     pass_s: float) -> dict[str, Any]:
    """Rounds of a whole-process ``once`` over ``n`` prepared leads, and the batched floor
    over as many, each round between two measures of the disk's single-row commit rate in
    the same directory; ``pass_s``: a bare interpreter's start and exit (``python -c
    pass``, from the start's pairs)."""
    found: list[dict[str, Any]] = []
    with workdir() as d:
        prepared = d / "prepared.db"
        anyio.run(_prepare, prepared, None, n, False)
        for i in range(rounds):
            run = d / f"round-{i}"
            for side in ("before", "after"):
                (run / side).mkdir(parents=True)
            (run / "scope.json").write_text(json.dumps(SCOPE))
            shutil.copyfile(prepared, run / "q.db")
            before = stdlib_single_commits(run / "before", max(300, n // 10))
            spawned = time.time()
            wall, cpu, out, err = timed(once_argv(run, "--log-format", "json"), env)
            ended = time.time()
            (run / "floor").mkdir()
            floor_per_s, _ = sqlite_floor(run / "floor", n)
            after = stdlib_single_commits(run / "after", max(300, n // 10))
            if json.loads(out)["confirmed"] != n:
                raise RuntimeError(f"once confirmed {json.loads(out)['confirmed']} of {n}")
            commits = (before + after) / 2
            spans = _spans(err, spawned, ended)
            best_s = n / floor_per_s + pass_s + START_GOAL_S  # the floor, started in time
            # the rate a dispatch would need to meet the goal with the start goal met
            # (infinite: no rate would, the start alone takes the whole budget)
            left_s = n / (DISPATCH_GOAL * commits) - pass_s - START_GOAL_S
            found.append({"wall_s": wall, "cpu_s": cpu, "per_s": n / wall,
                          "commits_per_s": commits, "ratio": n / wall / commits,
                          "in_process_ratio": n / spans["dispatch"] / commits,
                          "floor_per_s": floor_per_s, "floor_ratio": floor_per_s / commits,
                          "floor_with_start_ratio": n / best_s / commits,
                          "needed_over_floor": (n / left_s / floor_per_s if left_s > 0
                                                else float("inf")),
                          "spans_s": spans})
    ratio = statistics.median(r["ratio"] for r in found)
    return {"n": n, "rounds": rounds, "per_s": statistics.median(r["per_s"] for r in found),
            "commits_per_s": statistics.median(r["commits_per_s"] for r in found),
            "ratio": ratio,
            "in_process_ratio": statistics.median(r["in_process_ratio"] for r in found),
            "floor_per_s": statistics.median(r["floor_per_s"] for r in found),
            "floor_ratio": statistics.median(r["floor_ratio"] for r in found),
            "floor_with_start_ratio": statistics.median(r["floor_with_start_ratio"]
                                                        for r in found),
            "needed_over_floor": statistics.median(r["needed_over_floor"] for r in found),
            "spans_s": {name: statistics.median(r["spans_s"][name] for r in found)
                        for name, _, _ in SPANS},
            "goal": DISPATCH_GOAL, "met": ratio >= DISPATCH_GOAL,
            "round_figures": [{k: (round(v, 4) if isinstance(v, float) else
                                   {s: round(x, 4) for s, x in v.items()})
                               for k, v in r.items()} for r in found]}


def print_figures(start: dict[str, Any], dispatch: dict[str, Any]) -> None:
    diff, cpu = start["difference_s"], start["cpu_difference_s"]
    print(f"start: once on a warm empty store minus python -c pass, {start['pairs']} pairs: "
          f"median {diff['median'] * 1000:.0f} ms (p25-p75 {diff['p25'] * 1000:.0f}-"
          f"{diff['p75'] * 1000:.0f}, min-max {diff['min'] * 1000:.0f}-"
          f"{diff['max'] * 1000:.0f}); CPU {cpu['median'] * 1000:.0f} ms; goal <= "
          f"{START_GOAL_S * 1000:.0f} ms: {'met' if start['met'] else 'NOT met'}")
    spans = ", ".join(f"{name} {s:.3f} s" for name, s in dispatch["spans_s"].items())
    print(f"dispatch of {dispatch['n']:,} leads, whole process: {dispatch['per_s']:,.0f}/s, "
          f"{dispatch['ratio']:.2f}x the disk's {dispatch['commits_per_s']:,.0f} single-row "
          f"commits/s (dispatch span alone {dispatch['in_process_ratio']:.2f}x); goal >= "
          f"{DISPATCH_GOAL:g}x: {'met' if dispatch['met'] else 'NOT met'}")
    print(f"  the batched floor over as many leads (no process start): "
          f"{dispatch['floor_per_s']:,.0f}/s, {dispatch['floor_ratio']:.2f}x the disk; "
          f"as fast as it with the start goal met, a whole process would reach "
          f"{dispatch['floor_with_start_ratio']:.2f}x; the goal needs a dispatch "
          f"{dispatch['needed_over_floor']:.2f}x the floor's rate")
    print(f"  where the whole process went (medians): {spans}")
    print("  each round's ratio, whole / span: " + ", ".join(
        f"{r['ratio']:.2f}/{r['in_process_ratio']:.2f}" for r in dispatch["round_figures"]))


def main(argv: list[str] | None = None) -> int:
    from bench.results import record

    parser = argparse.ArgumentParser(prog="python -m bench startup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="5 pairs, one round of 2,000 leads, writes no results file")
    parser.add_argument("--pairs", type=int, help="interleaved start pairs (default 25)")
    parser.add_argument("--leads", type=int, help=f"leads dispatched (default {LEADS:,})")
    parser.add_argument("--rounds", type=int, help="dispatch rounds (default 3; quick 1)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    pairs = args.pairs or (5 if args.quick else 25)
    n = args.leads or (2000 if args.quick else LEADS)
    rounds = args.rounds or (1 if args.quick else 3)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    with workdir() as cache:
        env = compiled_env(cache)
        start = measure_start(pairs, env)
        dispatch = measure_dispatch(n, rounds, env, start["pass_s"])
    seconds = time.perf_counter() - started
    print(f"the fixed cost of a run ({machine()}; load average {load_before:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; {seconds:.0f} s; bytecode compiled on both sides)\n")
    print_figures(start, dispatch)
    doc = {"start": start, "dispatch": dispatch, "seconds": round(seconds, 1),
           "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
           "summary": machine()}
    print(json.dumps(doc, separators=(",", ":")))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not args.quick:
        record("startup", doc, script="-m bench startup", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
