"""Seeded chaos runner: real worker processes crashed at random named points (issue 8.1).

    python bench/chaos.py --runs 1000 --seed 8          # the documented full run
    python bench/chaos.py --runs 50 --seed 8            # what CI runs (pytest -m slow)
    python bench/chaos.py --every-point --runs 4        # the default test run: each point
                                                        # once at its first hit, then 4 more

``--record`` also writes the figures, dated, to ``bench/results/chaos-<UTC>.json``
(``bench/results.py``): the documentation renders the latest of them.

Each run is an episode in a fresh private directory, seeded by ``(seed, run)`` so any one
can be replayed alone with ``--only RUN``:

1. a client accepts a batch of synthetic leads (a library child, one commit per answer);
2. a warm-up leaves a mix of states: failed_safe (outage), confirmed, uncertain with a
   row in the target (timeout);
3. the "CRM" changes some statuses and deletes a confirmed row (kept aside so a resend
   would still be counted);
4. the crash run: ``accept`` (for ``accept.*`` points, then the client retries), ``once``
   or ``start --cycles 2`` with a random crash point armed by ``$RUNNER_CRASH_AT`` or
   ``--fault crash-at:``, at a random hit count, sometimes under a target fault, one run
   in two with batches of several records (always at a ``dispatch.batch-*`` point);
5. a restart that may itself be crashed at another random point, then a clean ``once``.

After every process the store and the target are audited (``bench/invariants.py``); after
the clean restart nothing may be in flight, prepared or failed_safe, and an uncertain
record may not have a row the readback would have found.  Crash points are dealt from a
shuffled deck so that every point is tried about equally; a point dealt three times or
more that never fired fails the run too (the harness would be testing nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaos_lane import (  # noqa: E402
    RUN,
    SCOPE,
    SWEEP_AT,
    WORKER_POINTS,
    Episode,
    Lane,
    add_backend_arguments,
    drop_postgres_schema,
    postgres_location,
)
from bench.results import record  # noqa: E402
from runner.crashpoints import POINTS  # noqa: E402


def _crash_args(rng: random.Random, point: str, first_hit: bool = False,
                ) -> tuple[list[str], dict[str, str]]:
    after = rng.choices([1, 2, 3], weights=[6, 3, 1])[0]
    if first_hit:  # a run that must reach its point: crash at the first hit
        after = 1
    if rng.random() < 0.5:
        return [], {"RUNNER_CRASH_AT": point, "RUNNER_CRASH_AFTER": str(after)}
    return ["--fault", f"crash-at:{point}@{after}"], {}


def _crash_accept(lane: Lane, point: str, index: int) -> None:
    key = f"c{index}-late"
    event = lane.dir / "late.json"
    event.write_text(json.dumps({**SCOPE, "source": "meta", "source_lead_id": key,
                                 "synthetic": True}), encoding="utf-8")
    crashed = lane.cli("accept", "--record", str(event), env={"RUNNER_CRASH_AT": point})
    lane.expect("crash accept", crashed, 73)
    lane.ep.fired = crashed.returncode == 73
    if crashed.stdout.strip():
        lane.ep.violations.append("crash accept: answered before dying")
    lane.check("after crashed accept", in_flight_ok=True)
    retry = lane.cli("accept", "--record", str(event))
    lane.expect("retried accept", retry, 0)
    want = "accepted" if point == "accept.before-commit" else "duplicate"
    got = json.loads(retry.stdout or "{}").get("result")
    if got != want:
        lane.ep.violations.append(f"retried accept: {got} where {want} was expected")
    lane.acked.add(key)


def _crash_sweep(lane: Lane, point: str, rng: random.Random, first_hit: bool) -> None:
    """The sweep dies mid-transaction or after its commit: ``sweep``, or ``start`` (whose
    scheduled sweep runs at start, beside the lead loop: a ``--cycles`` run may end first
    and cancel it, so a run that must reach its point is a ``sweep``)."""
    extra, env = _crash_args(rng, point, first_hit)
    if first_hit or rng.random() < 0.75:
        argv = [RUN, "sweep", "--db", str(lane.db), "--now", SWEEP_AT]
        crashed = lane.proc(argv, env or {"RUNNER_CRASH_AT": point})
    else:
        crashed = lane.cli("start", "--cycles", "2", "--interval", "0", "--now", SWEEP_AT,
                           *extra, env=env)
    lane.expect("crash sweep", crashed, 0, 73)
    lane.ep.fired = crashed.returncode == 73


def _batch_args(rng: random.Random, point: str) -> list[str]:
    """A batch size for a worker run: always several records at a batch point (so it is
    reached), else one record per request in one run of two and a batch of several in
    the other (issue 16)."""
    if point.startswith("dispatch.batch-"):
        return ["--batch-size", str(rng.choice([2, 3, 5]))]
    return ["--batch-size", str(rng.choice([2, 4, 7]) if rng.random() < 0.5 else 1)]


def _crash_worker(lane: Lane, point: str, rng: random.Random, first_hit: bool) -> None:
    command = ["once"] if rng.random() < 0.5 else ["start", "--cycles", "2", "--interval", "0"]
    extra, env = _crash_args(rng, point, first_hit)
    batched = point.startswith("dispatch.batch-")
    if rng.random() < 0.15 and not (batched and first_hit):
        # a record the outage leaves failed_safe is due again at once: the clean restart
        # must find nothing failed_safe, whatever the backoff would say
        extra += ["--fault", rng.choice(["outage", "timeout"]), "--retry-base", "0"]
    extra += _batch_args(rng, point)
    crashed = lane.cli(*command, *extra, env=env)
    lane.expect(f"crash run ({command[0]})", crashed, 0, 73)
    lane.ep.fired = crashed.returncode == 73


def run_episode(seed: int, index: int, point: str, root: Path, pg_dsn: str | None = None,
                first_hit: bool = False) -> Episode:
    rng = random.Random(f"{seed}:{index}")
    ep = Episode(index, point)
    directory = root / f"run-{index:05d}"
    directory.mkdir(mode=0o700)
    ep.directory = str(directory)
    db = postgres_location(pg_dsn, f"chaos_{seed}_{index}_{os.getpid()}") if pg_dsn else None
    lane = Lane(directory, ep, db)
    lane.setup(f"c{index}", rng.randint(6, 12),
               [rng.randint(0, 2), rng.randint(0, 3), rng.randint(1, 2)],
               "".join(rng.choice("dapql") for _ in range(rng.randint(2, 6))))
    lane.play_crm(rng)
    if point.startswith("accept."):
        _crash_accept(lane, point, index)
    elif point.startswith("sweep."):
        _crash_sweep(lane, point, rng, first_hit)
    else:
        _crash_worker(lane, point, rng, first_hit)
    lane.check("after the crash", in_flight_ok=True)
    if rng.random() < 0.25:
        again_at = rng.choice(WORKER_POINTS)
        extra, env = _crash_args(rng, again_at)
        again = lane.cli("once", *extra, *_batch_args(rng, again_at), env=env)
        lane.expect("crashed restart", again, 0, 73)
        ep.restart_crashed = again.returncode == 73
        lane.check("after the crashed restart", in_flight_ok=True)
    lane.expect("clean restart", lane.cli("once"), 0)
    lane.expect("clean sweep", lane.proc([RUN, "sweep", "--db", str(lane.db), "--now",
                                          SWEEP_AT]), 0)
    final = lane.check("after the clean restart", in_flight_ok=False)
    if left := lane.unswept():
        ep.violations.append(f"after the clean sweep: {left} candidates left to sweep")
    for state in ("prepared", "failed_safe"):
        if final.states[state]:
            ep.violations.append(f"after the clean restart: {final.states[state]} {state}")
    ep.states, ep.rows, ep.recovered = final.states, sum(final.rows.values()), len(final.recovered)
    ep.candidates = final.candidates
    if db is not None and not ep.violations:
        drop_postgres_schema(db)
    return ep


def deck(seed: int, runs: int, every_point: bool = False) -> list[str]:
    """The crash point of each run: rounds of every point, each round shuffled, so that
    every point is dealt ``runs // len(POINTS)`` times or once more; with ``every_point``,
    every point once in registry order first, then ``runs`` more from the deck."""
    rng = random.Random(seed)
    points: list[str] = []
    while len(points) < runs:
        round_ = list(POINTS)
        rng.shuffle(round_)
        points += round_
    return [*(POINTS if every_point else ()), *points[:runs]]


def summarize(episodes: list[Episode], seed: int, jobs: int, seconds: float) -> tuple[str, bool]:
    lines = [f"chaos: {len(episodes)} runs, seed {seed}, {jobs} jobs, {seconds:.1f} s", ""]
    head = f"{'crash point':<26} {'runs':>5} {'fired':>6} {'not reached':>12} " \
           f"{'restart crashed':>16} {'violations':>11}"
    lines += [head, "-" * len(head)]
    by_point: dict[str, list[Episode]] = {p: [] for p in POINTS}
    for ep in episodes:
        by_point[ep.point].append(ep)
    never = []
    for point, eps in by_point.items():
        fired = sum(e.fired for e in eps)
        if len(eps) >= 3 and not fired:
            never.append(point)
        lines.append(f"{point:<26} {len(eps):>5} {fired:>6} {len(eps) - fired:>12} "
                     f"{sum(e.restart_crashed for e in eps):>16} "
                     f"{sum(len(e.violations) for e in eps):>11}")
    violations = sum(len(e.violations) for e in episodes)
    lines.append("-" * len(head))
    lines.append(f"{'total':<26} {len(episodes):>5} {sum(e.fired for e in episodes):>6} "
                 f"{sum(not e.fired for e in episodes):>12} "
                 f"{sum(e.restart_crashed for e in episodes):>16} {violations:>11}")
    states: Counter[str] = Counter()
    for ep in episodes:
        states.update(ep.states)
    lines.append("")
    lines.append("end states: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
    swept: Counter[str] = Counter()
    for ep in episodes:
        swept.update(ep.candidates)
    lines.append("candidates: " + ", ".join(f"{k} {v}" for k, v in sorted(swept.items())))
    lines.append(f"records {sum(states.values())}, target rows "
                 f"{sum(e.rows for e in episodes)}, recovered by readback "
                 f"{sum(e.recovered for e in episodes)}")
    for ep in episodes:
        for v in ep.violations:
            lines.append(f"VIOLATION run {ep.index} ({ep.point}): {v}  [{ep.directory}]")
    for point in never:
        lines.append(f"VIOLATION: crash point {point} never fired")
    ok = violations == 0 and not never
    lines.append(f"result: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok


def figures(episodes: list[Episode], seed: int, jobs: int, backend: str, seconds: float,
            ok: bool) -> dict[str, object]:
    """The run's audit figures, for ``bench/results/chaos-*.json``."""
    states: Counter[str] = Counter()
    candidates: Counter[str] = Counter()
    for ep in episodes:
        states.update(ep.states)
        candidates.update(ep.candidates)
    return {
        "backend": backend, "runs": len(episodes), "seed": seed, "jobs": jobs,
        "seconds": round(seconds, 1), "ok": ok,
        "fired": sum(e.fired for e in episodes),
        "not_reached": sum(not e.fired for e in episodes),
        "restart_crashed": sum(e.restart_crashed for e in episodes),
        "violations": [v for e in episodes for v in e.violations],
        "points": {p: {"runs": sum(e.point == p for e in episodes),
                       "fired": sum(e.fired for e in episodes if e.point == p),
                       "restart_crashed": sum(e.restart_crashed for e in episodes
                                              if e.point == p)} for p in POINTS},
        "end_states": dict(sorted(states.items())),
        "records": sum(states.values()),
        "target_rows": sum(e.rows for e in episodes),
        "recovered_by_readback": sum(e.recovered for e in episodes),
        "candidates": dict(sorted(candidates.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", type=int, help="replay one run of the deck")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--record", action="store_true",
                        help="also write the figures to bench/results/chaos-<UTC>.json")
    parser.add_argument("--every-point", action="store_true",
                        help="first one run per crash point, crashing at its first hit "
                             "(each must fire), then --runs more as usual")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    pg_dsn = args.pg_dsn if args.backend == "postgres" else None
    points = deck(args.seed, args.runs, args.every_point)
    forced = len(POINTS) if args.every_point else 0  # runs that crash at the first hit
    indices = [args.only] if args.only is not None else list(range(len(points)))
    root = Path(tempfile.mkdtemp(prefix="runner-chaos-"))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        episodes = list(pool.map(
            lambda i: run_episode(args.seed, i, points[i], root, pg_dsn, i < forced),
            indices))
    seconds = time.monotonic() - started
    text, ok = summarize(episodes, args.seed, args.jobs, seconds)
    text = text.replace("chaos:", f"chaos ({args.backend}):", 1)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "runs": len(episodes), "seed": args.seed, "ok": ok,
            "fired": sum(e.fired for e in episodes),
            "violations": [v for e in episodes for v in e.violations],
            "points": {p: sum(e.fired for e in episodes if e.point == p) for p in POINTS},
        }), encoding="utf-8")
    if args.record:
        record("chaos", figures(episodes, args.seed, args.jobs, args.backend, seconds, ok),
               script="bench/chaos.py", argv=argv)
    for ep in episodes:
        if not ep.violations and not args.keep:
            shutil.rmtree(ep.directory, ignore_errors=True)
    if ok and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
