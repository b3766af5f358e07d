"""HTTP dispatch against the reference server (issue 17): ``once --target http://…`` at the
default batch size, against a bare httpx client posting the same batches to the same
server (the HTTP floor), in interleaved rounds so both see the same machine weather.

    python -m bench http-target           # full: 5,000 records, 5 rounds; writes
                                          # bench/results/http-target-<UTC>.json
    python -m bench http-target --quick   # small, for a look (writes nothing)
    python -m bench http-target --rounds 9   # more rounds, for a loaded machine

runner's figure is from ``once``'s own log (first send to last confirmation), so process
start-up is left out; for each batch it makes one commit to its store (the batch's
in-flight mark together with the outcomes of the batch before), one append request and
one exact readback request.  The floors:
``append only`` is the same append requests and nothing else (the issue's floor);
``append + read`` adds the readback request runner needs to prove each row.

Protocol version 2 (issue 29): the same ``once`` against a second server, ``target-serve
--dedupe``, which deduplicates and answers each append with the rows it holds, so runner
proves each batch from the append's answer and sends no readback.  Its ratio is to the
same append-only floor (against the version-1 server) of the same round (goal >= 0.35);
``bare append, --dedupe server`` is the bare client's appends against that second server,
to show what its answer (the rows) and its dedupe cost on the wire.

The floor is fair in what it shares with runner: the same server process (one for the
whole bench), the same batch size and rows of the same shape, one reused connection
(runner's adapter keeps one pool for the run; the floor one client), connected before the
clock starts (runner's target check connects before its first send), and the bodies built
from the records in the timed loop, as runner builds them per request.  It leaves out
what only runner does: the commit per batch, the readback (but in ``append + read``),
mapping each stored event to its record, and the log lines.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench.common import ROOT, RUN, SCOPE, TargetServer, machine, run_child, workdir
from bench.leads import _log_span, _prepare
from bench.results import record
from runner.io.targets.protocol import row_json
from runner.leads.models import CRMRecord
from runner.limits import DEFAULT_BATCH_SIZE


def _records(n: int, tag: str) -> list[tuple[CRMRecord, str]]:
    return [(CRMRecord(tenant=SCOPE["tenant_id"], source="meta",
                       source_lead_id=f"bench-{tag}-{i}", is_test=True,
                       contact_alias=f"alias-{i}"), f"bare-{tag}-{i}") for i in range(n)]


def bare(url: str, n: int, batch: int, tag: str, *, read: bool) -> float:
    """A bare httpx client posting the same batches: records per second.  Each body is
    built from its records inside the timed loop (``row_json``, as runner's adapter does
    for every request), then encoded by httpx; only the records exist beforehand."""
    items = _records(n, tag)
    batches = [items[i : i + batch] for i in range(0, n, batch)]
    with httpx.Client(timeout=30) as client:
        client.get(f"{url}/identity").raise_for_status()  # connect, as runner's check does
        started = time.perf_counter()
        for records in batches:
            body = {"rows": [row_json(r, w) for r, w in records]}
            answer = client.post(f"{url}/append", json=body)
            answer.raise_for_status()
            if read:
                ids = [row["write_id"] for row in body["rows"]]
                client.post(f"{url}/read", json={"write_ids": ids}).raise_for_status()
        return n / (time.perf_counter() - started)


def store_alone(n: int, batch: int, d: Path, r: int) -> float:
    """runner's store steps alone, for ``n`` prepared records on SQLite: each batch's one
    statement (``BlockingDispatchSteps.finish_and_mark_batch``, as a dispatch run makes
    it: the batch before confirmed, this batch marked in flight) and nothing else, no
    target, no log: records per second.  runner cannot dispatch faster than this."""
    from runner.clock import SystemClock
    from runner.ids import WriteId
    from runner.io.sqlite import connection
    from runner.io.sqlite.delivery import BlockingDispatchSteps
    from runner.leads.states import LeadState

    db = d / f"s{r}.db"
    anyio.run(_prepare, db, None, n, False)
    conn = connection.open_blocking(str(db))
    steps = BlockingDispatchSteps(conn, str(db))
    try:
        ids = [WriteId(w) for (w,) in conn.execute("SELECT write_id FROM leads ORDER BY seq")]
        now = SystemClock().now()
        started = time.perf_counter()
        done: list[tuple[WriteId, LeadState]] = []
        for start in range(0, n + batch, batch):
            marked = steps.finish_and_mark_batch(done, ids[start : start + batch], now)
            done = [(w, LeadState.CONFIRMED) for w in marked]
        return n / (time.perf_counter() - started)
    finally:
        steps.close()


def runner_rate(url: str, n: int, batch: int, d: Path, r: int) -> float:
    """``once --target URL`` over ``n`` prepared records: records per second, from its
    log (first send to last confirmation)."""
    db = d / f"q{r}.db"
    anyio.run(_prepare, db, None, n, False)
    scope = d / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    _, _, stdout, stderr = run_child(["once", "--db", str(db), "--scope", str(scope),
                                      "--target", url, "--log-format", "json",
                                      "--batch-size", str(batch)], with_stderr=True)
    confirmed = json.loads(stdout)["confirmed"]
    if confirmed != n:
        raise RuntimeError(f"once confirmed {confirmed} of {n}")
    return n / _log_span(stderr, ("lead.in_flight", "batch.in_flight"),
                         ("lead.confirmed", "batch.confirmed"))


#: runner's goal against a --dedupe server, as a ratio to the append-only floor (issue 29)
ROWS_GOAL = 0.35


def measure(n: int, rounds: int, batch: int = DEFAULT_BATCH_SIZE) -> dict[str, Any]:
    ours, floor, floor_read, store, ours_v2, floor_v2 = [], [], [], [], [], []
    with workdir() as d:
        server = TargetServer(d / "sheet.db", d / "server.log")
        v2 = TargetServer(d / "dedupe.db", d / "dedupe.log", "--dedupe")
        try:
            bare(server.url, batch, batch, "warm", read=True)
            bare(v2.url, batch, batch, "warm", read=False)
            for r in range(rounds):
                ours.append(runner_rate(server.url, n, batch, d, r))
                floor.append(bare(server.url, n, batch, f"a{r}", read=False))
                ours_v2.append(runner_rate(v2.url, n, batch, d, rounds + r))
                floor_read.append(bare(server.url, n, batch, f"b{r}", read=True))
                floor_v2.append(bare(v2.url, n, batch, f"c{r}", read=False))
                store.append(store_alone(n, batch, d, r))
        finally:
            server.stop()
            v2.stop()
        reads = _served_reads(d / "dedupe.log")
    return {
        "batch_size": batch,
        "runner_per_s": statistics.median(ours),
        "bare_append_per_s": statistics.median(floor),
        "bare_append_read_per_s": statistics.median(floor_read),
        "store_alone_per_s": statistics.median(store),
        "ratio": statistics.median(o / f for o, f in zip(ours, floor, strict=True)),
        "ratio_with_read": statistics.median(o / f for o, f in
                                             zip(ours, floor_read, strict=True)),
        "store_alone_ratio": statistics.median(s / f for s, f in
                                               zip(store, floor, strict=True)),
        # each round's ratio, for the spread on a shared machine
        "ratios": [round(o / f, 3) for o, f in zip(ours, floor, strict=True)],
        "rows": {
            "runner_per_s": statistics.median(ours_v2),
            "ratio": statistics.median(o / f for o, f in zip(ours_v2, floor, strict=True)),
            "ratios": [round(o / f, 3) for o, f in zip(ours_v2, floor, strict=True)],
            # runner against --dedupe over runner against the v1 server, round by round
            "to_v1": statistics.median(v / o for v, o in zip(ours_v2, ours, strict=True)),
            "goal": ROWS_GOAL,
            "bare_append_dedupe_per_s": statistics.median(floor_v2),
            "bare_append_dedupe_ratio": statistics.median(
                b / f for b, f in zip(floor_v2, floor, strict=True)),
            "server_reads": reads,
            # runner's store steps, then the --dedupe append, one after the other with
            # nothing else: what runner could reach if its own code took no time
            "ceiling": statistics.median(
                1 / (f / s + f / b) for s, b, f in zip(store, floor_v2, floor, strict=True)),
        },
    }


def _served_reads(log: Path) -> int:
    """The read requests the --dedupe server answered, from its "stopped:" line: runner's
    runs against it read nothing back (0 proves the rows came with the appends)."""
    lines = [line for line in log.read_text(encoding="utf-8").splitlines()
             if "stopped:" in line]
    return int(lines[-1].rsplit(", ", 1)[1].split()[0]) if lines else -1


def sustained(seconds: float, quota: int = 60, batch: int = 100) -> dict[str, Any]:
    """``start`` against ``target-serve --quota QUOTA/min`` for ``seconds``, batches of
    ``batch`` (issue 16 states its goal at 60 requests a minute and batches of 100, the
    default was 100 then): confirmed
    records per minute over the run's own span, against quota x batch size, and the
    server's rows (a duplicate is a write_id with two rows).  runner's ``--target-rate``
    is its write quota (the appends; reads are not paced), so it is given the server's
    append quota."""
    n = int(seconds / 60 * quota * batch * 1.5) + batch
    with workdir() as d:
        server = TargetServer(d / "sheet.db", d / "server.log", "--quota", f"{quota}/min")
        try:
            db, scope = d / "q.db", d / "scope.json"
            anyio.run(_prepare, db, None, n, False)
            scope.write_text(json.dumps(SCOPE))
            log = d / "worker.log"
            with open(log, "wb") as err:
                worker = subprocess.Popen(
                    [sys.executable, RUN, "start", "--db", str(db), "--scope", str(scope),
                     "--target", server.url, "--log-format", "json", "--batch-size",
                     str(batch), "--target-rate", f"{quota}/min", "--interval", "0"],
                    stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
                time.sleep(seconds)  # a bench measures time: this is the measurement
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=60)
        finally:
            server.stop()
        events = [json.loads(line) for line in log.read_bytes().splitlines()
                  if line.startswith(b"{")]
        import sqlite3
        with sqlite3.connect(d / "sheet.db") as conn:
            rows, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT write_id) FROM sheet").fetchone()
    from datetime import datetime

    sends = [datetime.fromisoformat(e["ts"]) for e in events
             if e.get("action") in ("batch.in_flight", "lead.in_flight")]
    done = [(datetime.fromisoformat(e["ts"]), e.get("count", 1)) for e in events
            if e.get("action") in ("batch.confirmed", "lead.confirmed")]
    span = (max(t for t, _ in done) - min(sends)).total_seconds()
    confirmed = sum(c for _, c in done)
    rejected = sum(1 for e in events if "RateLimited" in json.dumps(e))
    per_min = confirmed / span * 60
    return {"seconds": seconds, "quota_per_min": quota, "target_rate_per_min": quota,
            "batch_size": batch,
            "confirmed": confirmed, "span_s": round(span, 1), "per_min": per_min,
            "goal_per_min": quota * batch, "ratio_to_goal": per_min / (quota * batch),
            "rows": rows, "duplicates": rows - distinct, "rate_limited_lines": rejected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench http-target",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, writes nothing")
    parser.add_argument("--quota-seconds", type=float, default=None,
                        help="also run start against a 60/min server quota for this long "
                             "(default: 150 s in a full run, none with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds (default 5; 1 with --quick): more rounds "
                             "steady the medians on a shared machine")
    args = parser.parse_args(argv)
    n, rounds = (1000, 1) if args.quick else (5000, 5)
    if args.rounds is not None:
        rounds = max(1, args.rounds)
    started = time.perf_counter()
    found = measure(n, rounds)
    quota_seconds = args.quota_seconds if args.quota_seconds is not None else (
        0 if args.quick else 150)
    if quota_seconds:
        paced = sustained(quota_seconds)
        found["quota"] = paced
        print(f"with the server's quota at {paced['quota_per_min']}/min, batches of "
              f"{paced['batch_size']}: {paced['per_min']:,.0f} records/min over "
              f"{paced['span_s']} s (goal quota x batch = {paced['goal_per_min']:,}; ratio "
              f"{paced['ratio_to_goal']:.3f}, within 5%: "
              f"{abs(paced['ratio_to_goal'] - 1) <= 0.05}); {paced['rows']:,} rows, "
              f"{paced['duplicates']} duplicated; {paced['rate_limited_lines']} "
              "rate-limited log lines\n")
    seconds = time.perf_counter() - started
    print(f"HTTP dispatch, batch size {found['batch_size']} ({n:,} records, {rounds} "
          f"round(s); {machine()}; {seconds:.0f} s)\n")
    print(f"runner once --target http://…   {found['runner_per_s']:>9,.0f} records/s")
    print(f"bare httpx, append only         {found['bare_append_per_s']:>9,.0f} records/s"
          f"   ratio {found['ratio']:.2f} (target >= 0.7)")
    print(f"bare httpx, append + readback   {found['bare_append_read_per_s']:>9,.0f} "
          f"records/s   ratio {found['ratio_with_read']:.2f}")
    print(f"runner's store steps alone      {found['store_alone_per_s']:>9,.0f} records/s"
          f"   {found['store_alone_ratio']:.2f} of append only (no target, no log: "
          "runner's ceiling)")
    rows = found["rows"]
    print(f"runner, target-serve --dedupe   {rows['runner_per_s']:>9,.0f} records/s"
          f"   ratio {rows['ratio']:.2f} to append only (goal >= {ROWS_GOAL}: "
          f"{'met' if rows['ratio'] >= ROWS_GOAL else 'NOT met'}); rows in the append's "
          f"answer, {rows['server_reads']} read requests")
    print(f"                                rounds {rows['ratios']} (v1: "
          f"{found['ratios']}); {rows['to_v1']:.2f} x runner against the v1 server")
    print(f"bare httpx, --dedupe appends    {rows['bare_append_dedupe_per_s']:>9,.0f} "
          f"records/s   {rows['bare_append_dedupe_ratio']:.2f} of append only (the "
          "rows in the answer, the dedupe)")
    print(f"store steps then --dedupe appends, in sequence: ceiling {rows['ceiling']:.2f} "
          "of append only (runner's own code taking no time)")
    if not args.quick:
        record("http-target", {"n": n, "rounds": rounds, "seconds": round(seconds, 1),
                               "summary": machine(), **found},
               script="-m bench http-target", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
