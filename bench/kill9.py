"""kill -9 accounting (issue 8.2): ``start`` over many leads, SIGKILLed from outside at
random moments, restarted to completion, then counted the way Jepsen counts.

    python bench/kill9.py --runs 20 --leads 1000 --seed 9      # the documented full run
    python bench/kill9.py --runs 3 --leads 300 --seed 9        # what CI runs

``--record`` also writes the figures, dated, to ``bench/results/kill9-<UTC>.json``
(``bench/results.py``): the documentation renders the latest of them.

Each run: a client accepts the leads (one commit per answer; only answered keys count as
accepted); then 1-3 times a ``start`` worker (each with a random batch size: 1, 3, 10
or 50 records per request) is started and SIGKILLed after a random delay (before it took
the lock, mid-send, between commits, after it was done: wherever the moment falls); then
``start --cycles 1`` finishes the work.  Counted per run:

* lost: accepted, but at the end neither confirmed nor uncertain (nor
  confirmed_then_missing), or not in the store at all;
* duplicated: a key with more than one row in the target;
* unexpected: a target row for a key that was never accepted;
* recovered: records that went uncertain and were then confirmed by readback (from the
  outbox's ``state_changed`` events);
* uncertain: left uncertain for good, with no row to read back (killed between the
  in-flight commit and the send): visible, never resent.

Pass: lost = duplicated = unexpected = 0 and every invariant of ``bench/invariants.py``.

``--http-target`` (issue 17) delivers over real loopback HTTP to ``runner target-serve``
(the run's ``target.db`` is the server's sheet, so the same audit counts its rows): while
the workers are killed, the server injects faults drawn at random per run among
apply-then-drop, 429 storms, 500 and 503 before applying, apply-then-answer-late and
latency; the completing run meets the same server restarted without faults (the storm
has passed), so every record ends confirmed, or uncertain with no row to read back.

    python bench/kill9.py --runs 10 --leads 500 --seed 17 --http-target --record

Issue 29 adds two ways to end a campaign with no uncertain record left:

* ``--dedupe`` (with ``--http-target``): the server deduplicates by write_id
  (``target-serve --dedupe``), so runner itself sends again every uncertain record whose
  readback finds no row (SPEC E7); the pass then also needs ``uncertain = 0`` at the end,
  with no operator command.  ``--pg-table DSN`` does the same against the built-in
  PostgreSQL table target (``--target DSN --target-table``).
* ``--settle``: a target that cannot deduplicate; after the completing run, *one*
  ``runner resolve --all --as not-sent`` settles every uncertain record with no row, and
  one more run delivers them; the pass then needs ``uncertain = 0`` too.

``--kills N`` kills each run's worker exactly N times (default: 1-3 at random).

    python bench/kill9.py --runs 10 --kills 3 --leads 3000 --http-target --dedupe --record
    python bench/kill9.py --runs 10 --kills 3 --leads 3000 --settle --record
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaos_lane import (  # noqa: E402
    add_backend_arguments,
    drop_postgres_schema,
    postgres_location,
)
from bench.common import TargetServer  # noqa: E402
from bench.results import record  # noqa: E402
from harness.invariants import audit, query  # noqa: E402

RUN = str(ROOT / "run.py")
CHILD = str(ROOT / "bench" / "child.py")
SCOPE = {"tenant_id": "k9-tenant", "account_id": "k9-account", "page_id": "k9-page",
         "form_id": "k9-form"}
FINAL_STATES = {"confirmed", "uncertain", "confirmed_then_missing"}


@dataclass
class Result:
    run: int
    leads: int
    kills: int = 0
    confirmed: int = 0
    uncertain: int = 0
    recovered: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # --http-target: the server's faults
    requeued: int = 0  # records runner itself sent again (a deduplicating target: E7)
    settled: int = 0  # records decided by the one resolve --all (--settle)
    operator_commands: int = 0


#: the server faults a --http-target run draws from (``runner target-serve --fault``)
HTTP_FAULTS = ("drop-after-apply@0.2", "throttle@0.3", "error-before@0.1",
               "unavailable@0.1", "slow-after-apply:2@0.05", "latency:0.01@0.3")


def _start(db: str, scope: Path, target: Path | str, log: Path,
           *extra: str) -> subprocess.Popen[str]:
    with open(log, "a", encoding="utf-8") as out:
        return subprocess.Popen(
            [sys.executable, RUN, "start", "--db", str(db), "--scope", str(scope),
             "--target", str(target), *extra], stdout=out, stderr=subprocess.STDOUT, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("RUNNER_CRASH")})


#: each worker of a run sends one record per request or batches of several (issue 16)
BATCH_SIZES = (1, 3, 10, 50)


@dataclass(frozen=True)
class Mode:
    """How a campaign ends its runs (see the module docstring)."""

    http: bool = False
    dedupe: bool = False
    settle: bool = False
    pg_table: str | None = None  # the table target's DSN
    kills: int | None = None

    @property
    def dedupes(self) -> bool:
        return self.dedupe or self.pg_table is not None


#: the default batch in every worker of a run that ends with no uncertain record left (the
#: issue's campaign is at runner's default batch)
DEFAULT_BATCH = "1000"


def one_run(index: int, leads: int, seed: int, max_delay: float, root: Path,
            pg_dsn: str | None = None, http: bool = False,
            mode: Mode | None = None) -> Result:
    mode = mode or Mode(http=http)
    http = mode.http
    rng = random.Random(f"{seed}:{index}")
    result = Result(index, leads)
    started = time.monotonic()
    work = root / f"run-{index:03d}"
    work.mkdir(mode=0o700)
    target, log = work / "target.db", work / "worker.log"
    db = (postgres_location(pg_dsn, f"kill9_{seed}_{index}_{os.getpid()}") if pg_dsn
          else str(work / "queue.db"))
    scope = work / "scope.json"
    scope.write_text(json.dumps(SCOPE), encoding="utf-8")
    ingress = subprocess.run([sys.executable, CHILD, "accept", str(db), str(scope),
                              f"k{index}", "0", str(leads)],
                             capture_output=True, text=True, timeout=600, check=False)
    if ingress.returncode != 0:
        result.violations.append(f"accept failed: {ingress.stderr.strip()[-300:]}")
    accepted = {json.loads(line)["key"] for line in ingress.stdout.splitlines()}
    server = None
    dedupe = ("--dedupe",) if mode.dedupe else ()
    if http:
        faults = rng.sample(HTTP_FAULTS, rng.randint(1, 3))
        result.faults = faults
        server = TargetServer(target, work / "server.log", "--fault-seed",
                              str(rng.randrange(2**32)), *dedupe,
                              *[a for f in faults for a in ("--fault", f)])
    table = f"kill9_{seed}_{index}_{os.getpid()}"
    where: list[str] = ([mode.pg_table, "--target-table", table] if mode.pg_table
                        else [server.url if server else str(target)])
    for _ in range(mode.kills if mode.kills is not None else rng.randint(1, 3)):
        batch = DEFAULT_BATCH if (mode.dedupes or mode.settle) else str(rng.choice(BATCH_SIZES))
        sent_before = _sends(log)
        worker = _start(db, scope, where[0], log, *where[1:], "--interval", "0.05",
                        "--batch-size", batch)
        if mode.dedupes or mode.settle:  # a random moment once the worker is sending
            _wait_sending(log, sent_before, worker, db)
        delay = rng.uniform(0.0, max_delay)
        try:
            worker.wait(timeout=delay)
            result.violations.append(f"the worker exited by itself ({worker.returncode})")
        except subprocess.TimeoutExpired:
            os.kill(worker.pid, signal.SIGKILL)  # from outside, at a random moment
            worker.wait(timeout=60)
            result.kills += 1
        mid = audit(db, target, accepted=accepted, in_flight_ok=True, dedupes=mode.dedupes,
                    rows=_table_rows(mode.pg_table, table) if mode.pg_table else None)
        result.violations += [f"after kill {result.kills}: {v}" for v in mid.violations]
    if server is not None:  # the storm passes: the same sheet, served without faults
        server.stop()
        server = TargetServer(target, work / "server.log", *dedupe)
        where = [server.url]
    final_batch = (DEFAULT_BATCH if (mode.dedupes or mode.settle)
                   else str(rng.choice(BATCH_SIZES)))
    _complete(db, scope, where, log, final_batch, result, dedupes=mode.dedupes)
    if mode.settle:  # one operator command for every uncertain record with no row
        result.operator_commands += 1
        settle = subprocess.run(
            [sys.executable, RUN, "resolve", "--db", str(db), "--target", where[0],
             *where[1:], "--all", "--as", "not-sent", "--reason",
             "kill -9 campaign: crashed between the in-flight commit and the request"],
            capture_output=True, text=True, timeout=600, check=False)
        if settle.returncode != 0:
            result.violations.append(f"resolve --all exited {settle.returncode}: "
                                     f"{settle.stderr.strip()[-300:]}")
        else:
            result.settled = int(json.loads(settle.stdout.splitlines()[-1])["decided"])
        _complete(db, scope, where, log, final_batch, result, dedupes=False)
    if server is not None:
        server.stop()
    end = audit(db, target, accepted=accepted, in_flight_ok=False, dedupes=mode.dedupes,
                rows=_table_rows(mode.pg_table, table) if mode.pg_table else None)
    result.violations += [v for v in end.violations
                          if not v.startswith(("lost", "duplicated", "unexpected"))]
    with_row = set(end.rows)
    result.confirmed = end.states["confirmed"]
    result.uncertain = end.states["uncertain"]
    result.recovered = len(end.recovered)
    result.duplicated = sum(1 for n in end.rows.values() if n > 1)
    result.unexpected = len(with_row - end.keys)
    states = _states(db)
    result.lost = sum(1 for key in accepted if states.get(key) not in FINAL_STATES)
    stuck = [k for k, s in states.items() if s == "uncertain" and k in with_row]
    if stuck:
        result.violations.append(f"{len(stuck)} uncertain records have a row to read back")
    result.requeued = len(query(db, "SELECT seq FROM {t}outbox WHERE kind = ?",
                                "resend_authorized"))
    if (mode.dedupes or mode.settle) and result.uncertain:
        result.violations.append(f"{result.uncertain} records left uncertain")
    pending = [k for k, s in states.items() if s in ("prepared", "failed_safe", "in_flight")]
    if (mode.dedupes or mode.settle) and pending:
        result.violations.append(f"{len(pending)} records not delivered at the end")
    if mode.pg_table:
        _drop_table(mode.pg_table, table)
    result.seconds = time.monotonic() - started
    if pg_dsn and not result.violations:
        drop_postgres_schema(db)
    return result


def _sends(log: Path) -> int:
    """How many sends the workers of a run have logged so far."""
    try:
        return log.read_text(encoding="utf-8", errors="replace").count(".in_flight ")
    except FileNotFoundError:
        return 0


def _wait_sending(log: Path, before: int, worker: subprocess.Popen[str], db: str) -> None:
    """Until this worker has logged a send (or exited, or has nothing left to send, or
    60 s passed)."""
    deadline = time.monotonic() + 60
    checked = time.monotonic()
    while _sends(log) <= before and worker.poll() is None and time.monotonic() < deadline:
        if time.monotonic() - checked > 1:  # nothing left to send: no send will come
            checked = time.monotonic()
            if not set(_states(db).values()) & {"prepared", "failed_safe", "uncertain",
                                                 "in_flight"}:
                return
        time.sleep(0.01)  # bench code: polling a child's log, with a deadline


def _complete(db: str, scope: Path, where: list[str], log: Path, batch: str,
              result: Result, *, dedupes: bool) -> None:
    """Run ``start --cycles 1`` until nothing is left to send (a record queued again waits
    out its backoff; a deduplicating target's uncertain record is queued again by the
    next cycle), at most 30 times."""
    for _ in range(30):
        final = _start(db, scope, where[0], log, *where[1:], "--cycles", "1",
                       "--interval", "0", "--batch-size", batch)
        if final.wait(timeout=600) != 0:
            result.violations.append(f"the completing run exited {final.returncode}")
            return
        left = {s for s in _states(db).values()} & (
            {"prepared", "failed_safe", "in_flight"} | ({"uncertain"} if dedupes else set()))
        if not left:
            return
        time.sleep(0.5)  # bench code: a backoff is due in about a second


def _table_rows(dsn: str, table: str) -> list[tuple[str, str]]:
    """(source_lead_id, write_id) of every row of the PostgreSQL table target."""
    import asyncio

    import asyncpg

    async def read() -> list[tuple[str, str]]:
        conn = await asyncpg.connect(dsn)
        try:
            exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
            if not exists:
                return []
            return [(str(r[0]), str(r[1])) for r in await conn.fetch(
                f'SELECT source_lead_id, write_id FROM "{table}"')]
        finally:
            await conn.close()

    return asyncio.run(read())


def _drop_table(dsn: str, table: str) -> None:
    import asyncio

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def _states(db: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in query(db, "SELECT source_lead_id, state FROM {t}leads")}


COLUMNS = ("run", "leads", "kills", "confirmed", "uncertain", "recovered", "requeued",
           "settled", "lost", "duplicated", "unexpected", "seconds")


def table(results: list[Result], seed: int) -> tuple[str, bool]:
    lines = [f"kill -9: {len(results)} runs, seed {seed}", "",
             " ".join(f"{c:>10}" for c in COLUMNS)]
    lines.append("-" * len(lines[-1]))
    for r in results:
        lines.append(" ".join(f"{getattr(r, c):>10.1f}" if c == "seconds"
                              else f"{getattr(r, c):>10}" for c in COLUMNS))
    lines.append("-" * len(lines[2]))
    totals = [sum(getattr(r, c) for r in results) for c in COLUMNS[1:]]
    lines.append(f"{'total':>10} " + " ".join(
        f"{t:>10.1f}" if c == "seconds" else f"{t:>10}" for c, t in zip(COLUMNS[1:], totals,
                                                                         strict=True)))
    bad = [f"VIOLATION run {r.run}: {v}" for r in results for v in r.violations]
    ok = not bad and all(r.lost == r.duplicated == r.unexpected == 0 for r in results)
    lines += [*bad, f"result: {'PASS' if ok else 'FAIL'} (lost = duplicated = unexpected = 0)"]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--leads", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--max-delay", type=float, default=None,
                        help="kill within this many seconds of a start (default: scaled "
                             "to --leads, about the time a start needs to send them all)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--record", action="store_true",
                        help="also write the figures to bench/results/kill9-<UTC>.json")
    parser.add_argument("--http-target", action="store_true",
                        help="deliver over HTTP to runner target-serve, with server faults "
                             "drawn at random per run")
    parser.add_argument("--dedupe", action="store_true",
                        help="with --http-target: the server deduplicates by write_id; "
                             "pass needs 0 uncertain at the end, with no operator command")
    parser.add_argument("--pg-table", metavar="DSN",
                        help="deliver to the built-in PostgreSQL table target at DSN (it "
                             "deduplicates); pass needs 0 uncertain at the end")
    parser.add_argument("--settle", action="store_true",
                        help="one resolve --all --as not-sent after the completing run, "
                             "then one more run; pass needs 0 uncertain at the end")
    parser.add_argument("--kills", type=int, default=None,
                        help="kill each run's worker exactly this many times (default 1-3)")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    pg_dsn = args.pg_dsn if args.backend == "postgres" else None
    started = time.monotonic()
    # over HTTP a start needs longer to send them all (requests, faults, 429 waits)
    max_delay = args.max_delay or (2.5 + args.leads * 0.01 if args.http_target
                                   else 0.3 + args.leads * 0.001)
    root = Path(tempfile.mkdtemp(prefix="runner-kill9-"))
    if args.dedupe and not args.http_target:
        parser.error("--dedupe is for --http-target (--pg-table deduplicates anyway)")
    mode = Mode(http=args.http_target, dedupe=args.dedupe, settle=args.settle,
                pg_table=args.pg_table, kills=args.kills)
    results = [one_run(i, args.leads, args.seed, max_delay, root, pg_dsn, mode=mode)
               for i in range(args.runs)]
    text, ok = table(results, args.seed)
    over = (", HTTP target with faults" if args.http_target else "") + (
        ", deduplicating" if args.dedupe else "") + (
        ", PostgreSQL table target" if args.pg_table else "") + (
        ", settled by one resolve --all" if args.settle else "")
    text = text.replace("kill -9:", f"kill -9 ({args.backend}{over}):", 1)
    if args.http_target:  # before the verdict, which stays the last line
        *body, verdict = text.split("\n")
        text = "\n".join([*body, *(f"run {r.run} server faults: {', '.join(r.faults)}"
                                    for r in results), verdict])
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "ok": ok, "runs": len(results), "seed": args.seed,
            "results": [r.__dict__ for r in results]}), encoding="utf-8")
    if args.record:
        totals = {c: sum(getattr(r, c) for r in results) for c in COLUMNS[1:]}
        totals["seconds"] = round(totals["seconds"], 1)
        name = ("kill9-pg-table" if args.pg_table else "kill9-http-dedupe" if args.dedupe
                else "kill9-settle" if args.settle
                else "kill9-http-target" if args.http_target else "kill9")
        record(name, {
            "backend": args.backend, "runs": len(results), "leads": args.leads,
            "mode": {"http": mode.http, "dedupe": mode.dedupe, "settle": mode.settle,
                     "pg_table": mode.pg_table is not None, "kills": mode.kills},
            "seed": args.seed, "max_delay": max_delay, "ok": ok,
            "seconds": round(time.monotonic() - started, 1), "totals": totals,
            "violations": [v for r in results for v in r.violations],
            "results": [{**r.__dict__, "seconds": round(r.seconds, 1)} for r in results]},
            script="bench/kill9.py", argv=argv)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept for inspection: {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
