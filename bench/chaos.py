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

``--http-target`` (issue 17) runs the same episodes over real loopback HTTP: after the
warm-up, ``runner target-serve`` serves the episode's sheet with apply-then-drop and one
or two other server faults drawn at random (429 storms, 500 and 503 before applying,
apply-then-answer-late, latency), and the crash run and the crashed restart deliver to it
(``--retry-base 0``, a read timeout of 0.5 s; no runner-side target fault).  The clean restart
meets the same sheet served without faults (the storm has passed), once every
failed_safe record is due; after it an uncertain record may not have a row.  The two
crash points hit inside the synthetic target (``dispatch.batch-applied``,
``dispatch.batch-mid-readback``) are in the server process there, and so are not dealt,
nor are ``accept.*``, ``sweep.*`` and ``resolve.*`` (no target call, or not a worker's).
A ``resolve.*`` point is reached by ``resolve --all`` after a worker crashed before its
request (issue 29).

    python bench/chaos.py --runs 200 --seed 17 --http-target

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
import re
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
from bench.common import TargetServer  # noqa: E402
from bench.results import record  # noqa: E402
from harness.invariants import query  # noqa: E402
from runner.crashpoints import POINTS  # noqa: E402

#: crash points hit inside the synthetic target: over HTTP, in the server process
TARGET_POINTS = ("dispatch.batch-applied", "dispatch.batch-mid-readback")
#: the points an --http-target run deals: the worker's own, around its target calls
HTTP_POINTS = tuple(p for p in WORKER_POINTS if p not in TARGET_POINTS)
#: the server faults of an --http-target episode: apply-then-drop always (the ambiguous
#: case), and one or two of the others (those of ``bench/kill9.py``, more often, as an
#: episode sends only a few batches)
DROP_FAULT = "drop-after-apply@0.4"
CHAOS_HTTP_FAULTS = ("throttle@0.5", "error-before@0.3", "unavailable@0.3",
                     "slow-after-apply:1@0.2", "latency:0.01@0.5")
#: the worker's read timeout over HTTP, below slow-after-apply's delay (which is then
#: an ambiguous answer)
HTTP_READ_TIMEOUT = "0.5"
HTTP_WORKER_ARGS = ["--retry-base", "0", "--target-timeout", HTTP_READ_TIMEOUT]
#: the longest wait for a failed_safe record to fall due before the clean restart
MAX_DUE_WAIT = 10.0


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


def _crash_resolve(lane: Lane, point: str, rng: random.Random, first_hit: bool) -> None:
    """``resolve --all`` dies before or after a page's commit (issue 29): a worker killed
    between a batch's in-flight commit and its request first leaves records with no row,
    then one ``resolve --all --as not-sent`` crashes at the point, pages of two; the clean
    restart delivers what it decided, and the rest stay uncertain with no row."""
    made = lane.cli("once", "--fault", "crash-before-write", "--batch-size",
                    str(rng.choice([2, 3, 5])))
    lane.expect("crash before write", made, 0, 73)
    after = 1 if first_hit else rng.choice([1, 2])
    crashed = lane.cli("resolve", "--all", "--as", "not-sent", "--reason", "chaos episode",
                       "--batch-size", "2",
                       env={"RUNNER_CRASH_AT": point, "RUNNER_CRASH_AFTER": str(after)})
    lane.expect("crash resolve", crashed, 0, 73)
    lane.ep.fired = crashed.returncode == 73


def _batch_args(rng: random.Random, point: str) -> list[str]:
    """A batch size for a worker run: always several records at a batch point (so it is
    reached), else one record per request in one run of two and a batch of several in
    the other (issue 16)."""
    if point.startswith("dispatch.batch-"):
        return ["--batch-size", str(rng.choice([2, 3, 5]))]
    return ["--batch-size", str(rng.choice([2, 4, 7]) if rng.random() < 0.5 else 1)]


def _crash_worker(lane: Lane, point: str, rng: random.Random, first_hit: bool,
                  http: bool = False) -> None:
    command = ["once"] if rng.random() < 0.5 else ["start", "--cycles", "2", "--interval", "0"]
    extra, env = _crash_args(rng, point, first_hit)
    batched = point.startswith("dispatch.batch-")
    if http:  # the server's faults; a record they leave failed_safe is due again at once
        extra += HTTP_WORKER_ARGS  # (or after the server's Retry-After)
    elif rng.random() < 0.15 and not (batched and first_hit):
        # a record the outage leaves failed_safe is due again at once: the clean restart
        # must find nothing failed_safe, whatever the backoff would say
        extra += ["--fault", rng.choice(["outage", "timeout"]), "--retry-base", "0"]
    extra += _batch_args(rng, point)
    crashed = lane.cli(*command, *extra, env=env)
    lane.expect(f"crash run ({command[0]})", crashed, 0, 73)
    lane.ep.fired = crashed.returncode == 73


def _crash_run(lane: Lane, point: str, index: int, rng: random.Random, first_hit: bool,
               http: bool) -> None:
    """The crash run, then one time in four a restart crashed at another point."""
    if point.startswith("accept."):
        _crash_accept(lane, point, index)
    elif point.startswith("sweep."):
        _crash_sweep(lane, point, rng, first_hit)
    elif point.startswith("resolve."):
        _crash_resolve(lane, point, rng, first_hit)
    else:
        _crash_worker(lane, point, rng, first_hit, http)
    lane.check("after the crash", in_flight_ok=True)
    if rng.random() < 0.25:
        again_at = rng.choice(HTTP_POINTS if http else WORKER_POINTS)
        extra, env = _crash_args(rng, again_at)
        if http:
            extra += HTTP_WORKER_ARGS
        again = lane.cli("once", *extra, *_batch_args(rng, again_at), env=env)
        lane.expect("crashed restart", again, 0, 73)
        lane.ep.restart_crashed = again.returncode == 73
        lane.check("after the crashed restart", in_flight_ok=True)


_STOPPED = re.compile(r"stopped: (\d+) appends, (\d+) rows, (\d+) throttled, (\d+) dropped")


def _served(log: Path) -> Counter[str]:
    """What a stopped ``target-serve`` says it did (its last "stopped:" line)."""
    found = _STOPPED.findall(log.read_text(encoding="utf-8"))
    if not found:
        return Counter()
    return Counter(dict(zip(("appends", "rows", "throttled", "dropped"),
                            map(int, found[-1]), strict=True)))


def _wait_until_due(lane: Lane) -> None:
    """Wait until every failed_safe record is due (a server's ``Retry-After`` put its
    next attempt up to a few seconds ahead), at most ``MAX_DUE_WAIT``."""
    from datetime import UTC, datetime

    rows = query(lane.db, "SELECT max(next_attempt_at) FROM {t}leads "
                          "WHERE state = 'failed_safe'")
    last = rows[0][0] if rows else None
    if last is None:
        return
    due = datetime.fromisoformat(str(last).replace("Z", "+00:00")) if isinstance(
        last, str) else last
    wait = (due - datetime.now(UTC)).total_seconds()
    if wait > MAX_DUE_WAIT:
        lane.ep.violations.append(f"a failed_safe record is due only in {wait:.1f} s")
    elif wait > 0:
        time.sleep(wait + 0.05)  # until a stored deadline has passed


def _uncertain_with_rows(lane: Lane, rows: Counter[str]) -> int:
    """Uncertain records the target holds a row for (a readback would find it)."""
    keys = [str(k) for (k,) in query(lane.db, "SELECT source_lead_id FROM {t}leads "
                                              "WHERE state = 'uncertain'")]
    return sum(1 for key in keys if rows.get(key))


def run_episode(seed: int, index: int, point: str, root: Path, pg_dsn: str | None = None,
                first_hit: bool = False, http: bool = False) -> Episode:
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
    servers: list[TargetServer] = []
    try:
        if http:
            ep.faults = [DROP_FAULT, *rng.sample(CHAOS_HTTP_FAULTS, rng.randint(1, 2))]
            servers.append(TargetServer(
                lane.target, directory / "server.log", "--fault-seed",
                str(rng.randrange(2**32)), *[a for f in ep.faults for a in ("--fault", f)]))
            # the server of the clean restart, over the same sheet without faults, starts
            # now so that its start-up overlaps the crash run; nothing calls it before
            servers.append(TargetServer(lane.target, directory / "clean-server.log"))
            lane.target_arg = servers[0].url
        _crash_run(lane, point, index, rng, first_hit, http)
        if http:  # the storm passes: the same sheet, served without faults
            servers.pop(0).stop()
            ep.served = _served(directory / "server.log")
            lane.target_arg = servers[0].url
            _wait_until_due(lane)
        lane.expect("clean restart", lane.cli("once"), 0)
    finally:
        for server in servers:
            server.stop()
    lane.expect("clean sweep", lane.proc([RUN, "sweep", "--db", str(lane.db), "--now",
                                          SWEEP_AT]), 0)
    final = lane.check("after the clean restart", in_flight_ok=False)
    if left := lane.unswept():
        ep.violations.append(f"after the clean sweep: {left} candidates left to sweep")
    for state in ("prepared", "failed_safe"):
        if final.states[state]:
            ep.violations.append(f"after the clean restart: {final.states[state]} {state}")
    if http and (stuck := _uncertain_with_rows(lane, final.rows)):
        ep.violations.append(f"after the clean restart: {stuck} uncertain records have a "
                             "row to read back")
    ep.states, ep.rows, ep.recovered = final.states, sum(final.rows.values()), len(final.recovered)
    ep.candidates = final.candidates
    if db is not None and not ep.violations:
        drop_postgres_schema(db)
    return ep


def deck(seed: int, runs: int, every_point: bool = False,
         among: tuple[str, ...] = tuple(POINTS)) -> list[str]:
    """The crash point of each run: rounds of every point (``among``), each round
    shuffled, so that every point is dealt ``runs // len(among)`` times or once more; with
    ``every_point``, every point once in registry order first, then ``runs`` more from
    the deck."""
    rng = random.Random(seed)
    points: list[str] = []
    while len(points) < runs:
        round_ = list(among)
        rng.shuffle(round_)
        points += round_
    return [*(among if every_point else ()), *points[:runs]]


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
    served: Counter[str] = Counter()
    for ep in episodes:
        served.update(ep.served)
    if served:
        lines.append("the faulty servers: " + ", ".join(
            f"{served[k]} {k}" for k in ("appends", "rows", "throttled", "dropped")))
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
    parser.add_argument("--http-target", action="store_true",
                        help="deliver over HTTP to runner target-serve with server faults "
                             "drawn at random (issue 17)")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    pg_dsn = args.pg_dsn if args.backend == "postgres" else None
    among = HTTP_POINTS if args.http_target else tuple(POINTS)
    points = deck(args.seed, args.runs, args.every_point, among)
    forced = len(among) if args.every_point else 0  # runs that crash at the first hit
    indices = [args.only] if args.only is not None else list(range(len(points)))
    root = Path(tempfile.mkdtemp(prefix="runner-chaos-"))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        episodes = list(pool.map(
            lambda i: run_episode(args.seed, i, points[i], root, pg_dsn, i < forced,
                                  args.http_target),
            indices))
    seconds = time.monotonic() - started
    text, ok = summarize(episodes, args.seed, args.jobs, seconds)
    over = ", HTTP target with server faults" if args.http_target else ""
    text = text.replace("chaos:", f"chaos ({args.backend}{over}):", 1)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "runs": len(episodes), "seed": args.seed, "ok": ok, "http": args.http_target,
            "faults": dict(Counter(f for e in episodes for f in e.faults)),
            "served": dict(sum((e.served for e in episodes), Counter())),
            "records": sum(sum(e.states.values()) for e in episodes),
            "end_states": dict(sum((e.states for e in episodes), Counter())),
            "target_rows": sum(e.rows for e in episodes),
            "recovered_by_readback": sum(e.recovered for e in episodes),
            "fired": sum(e.fired for e in episodes),
            "violations": [v for e in episodes for v in e.violations],
            "points": {p: sum(e.fired for e in episodes if e.point == p) for p in POINTS},
        }), encoding="utf-8")
    if args.record:
        found = figures(episodes, args.seed, args.jobs, args.backend, seconds, ok)
        if args.http_target:
            found["faults"] = dict(Counter(f for e in episodes for f in e.faults))
            found["served"] = dict(sum((e.served for e in episodes), Counter()))
        record("chaos-http" if args.http_target else "chaos", found,
               script="bench/chaos.py", argv=argv)
    for ep in episodes:
        if not ep.violations and not args.keep:
            shutil.rmtree(ep.directory, ignore_errors=True)
    if ok and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
