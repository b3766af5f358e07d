"""How long ``start`` is away when its PostgreSQL server dies (issue 30): from the
server's death to the first confirmed delivery after it is back, beside the server's own
restart time, over several runs (median and maximum).

    python -m bench failover           # 7 runs; writes bench/results/failover-<UTC>.json
    python -m bench failover --quick   # 2 runs (writes nothing)
    python -m bench failover --runs 15

Each run, on a private cluster of its own (``harness/pgcluster.py``: the server's tools in
a temporary directory, on a free loopback port; the shared server is never touched):

1. N leads are accepted into a new store, and ``runner start`` delivers them to a
   synthetic target at a paced rate (``--target-rate``, batches of ``--batch-size``), so
   that delivery is still going on when the server dies and goes on after it is back;
2. once the target holds a few batches, the postmaster is killed with SIGKILL (the clock
   ``t_kill`` is read just before the signal) and, as soon as it and its backends are
   gone, started again (``t_start``) until it takes connections (``t_ready``, the line
   ``ready`` in postmaster.pid: crash recovery included);
3. runner's own log (JSON lines, dated to the microsecond) gives ``store.reconnected``
   and the first confirmation after it (``batch.confirmed``, ``lead.confirmed``, or a
   readback's ``batch.reconciled``/``lead.reconciled``: a record in flight at the kill
   confirmed by reading it back; a batch committed just before the kill may be logged
   just after it, which is why the reconnect is the mark);
4. when every record is confirmed or uncertain, ``start`` is stopped (SIGTERM) and the
   target is checked for rows written twice (there must be none).

Figures per run: ``failover`` = first confirmation - ``t_kill`` (what a user sees);
``restart`` = ``t_ready`` - ``t_start`` (the server's own restart); ``outage`` =
``t_ready`` - ``t_kill``; ``lag`` = first confirmation - ``t_ready`` (runner's share: the
backoff's wait for the next attempt, the reconnect, the lock, recovery and the first
batch).  Times are wall-clock (runner's log lines are), on one machine.  A failover on a
primary/standby pair (a promotion instead of a restart) is measured the same way by
``python -m bench forget --mode sync`` (bench/forget.py), beside the promotion time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from bench.results import record  # noqa: E402

SCOPE = {"tenant_id": "tenant-bench-1", "account_id": "account-bench-1",
         "page_id": "page-bench-1", "form_id": "form-bench-1"}
CONFIRMS = {"batch.confirmed", "lead.confirmed", "batch.reconciled", "lead.reconciled"}


def _event(i: int) -> dict[str, Any]:
    return {**SCOPE, "source": "meta", "source_lead_id": f"lead-{i}", "synthetic": True,
            "contact_alias": f"alias-{i}"}


def _cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _rows(target: Path) -> list[tuple[str, str]]:
    if not target.exists():
        return []
    try:
        with sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=5) as conn:
            return [(str(w), str(k)) for w, k in conn.execute(
                "SELECT write_id, source_lead_id FROM sheet")]
    except sqlite3.OperationalError:
        return []


def _settled(db: str) -> bool:
    proc = _cli("status", "--db", db)
    if proc.returncode != 0:
        return False
    found = json.loads(proc.stdout)["counts"]
    return not any(found[s] for s in ("prepared", "in_flight", "failed_safe"))


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _ts(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00")).timestamp()


def one_run(cluster: Any, n: int, batch: int, rate: str, index: int) -> dict[str, Any]:
    """One kill -9 and restart during delivery; the run's figures (seconds)."""
    work = Path(tempfile.mkdtemp(prefix="runner-bench-failover-"))
    try:
        scope = work / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        records = work / "events.ndjson"
        records.write_text("".join(json.dumps(_event(i)) + "\n" for i in range(n)))
        db = cluster.dsn("postgres", schema=f"bench_{index}")
        target = work / "target.db"
        accepted = _cli("accept", "--db", db, "--scope", scope, "--records", records)
        assert accepted.returncode == 0, accepted.stderr
        log = work / "runner.log"
        with open(log, "w") as err:
            child = subprocess.Popen(
                [sys.executable, str(ROOT / "run.py"), "start", "--db", db, "--scope", scope,
                 "--target", target, "--interval", "0.05", "--batch-size", str(batch),
                 "--target-rate", rate, "--log-format", "json"],
                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        try:
            _wait(lambda: len(_rows(target)) >= 3 * batch, 60, "the first batches")
            t_kill = time.time()
            cluster.kill9()
            t_start = time.time()
            cluster.start()
            t_ready = time.time()
            _wait(lambda: _settled(db), 120, "every record confirmed or uncertain")
            child.send_signal(signal.SIGTERM)
            code = child.wait(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert code == 0, log.read_text()[-2000:]
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        # a batch committed just before the kill may be logged just after it: the first
        # confirmation through the restarted server is the first after the reconnect
        back = next(i for i, x in enumerate(lines) if x.get("action") == "store.reconnected"
                    and x.get("task") == "start" and _ts(x) > t_kill)
        reconnected = lines[back]
        first = next(_ts(x) for x in lines[back:] if x.get("action") in CONFIRMS)
        rows = _rows(target)
        proc = _cli("status", "--db", db)
        counts = json.loads(proc.stdout)["counts"]
        return {
            "failover": round(first - t_kill, 3),
            "restart": round(t_ready - t_start, 3),
            "outage": round(t_ready - t_kill, 3),
            "lag": round(first - t_ready, 3),
            "reconnect_attempts": int(reconnected.get("count", 0)),
            "duplicated_rows": len(rows) - len({w for w, _ in rows}),
            "confirmed": int(counts["confirmed"]),
            "uncertain": int(counts["uncertain"]),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs]
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3),
            "min": round(min(values), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench failover",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 runs, writes nothing")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--leads", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--target-rate", default="10/s",
                        help="requests a second (batches): delivery outlasts the outage")
    args = parser.parse_args(argv)
    from harness.pgcluster import make_cluster, unavailable
    reason = unavailable()
    if reason is not None:
        print(f"bench failover: no private cluster can be made here: {reason}",
              file=sys.stderr)
        return 2
    runs_wanted = 2 if args.quick else args.runs
    started = time.perf_counter()
    cluster = make_cluster()
    try:
        runs = [one_run(cluster, args.leads, args.batch_size, args.target_rate, i)
                for i in range(runs_wanted)]
    finally:
        cluster.destroy()
    seconds = time.perf_counter() - started
    found = {key: _summary(runs, key) for key in ("failover", "restart", "outage", "lag")}
    print(f"start through a kill -9 and restart of its PostgreSQL server ({runs_wanted} "
          f"runs, {args.leads:,} leads, batches of {args.batch_size} at "
          f"{args.target_rate}; {machine()}; {seconds:.0f} s)\n")
    labels = {"failover": "death -> first confirmed delivery",
              "restart": "the server's own restart (start -> ready)",
              "outage": "death -> server ready",
              "lag": "server ready -> first confirmed delivery"}
    for key, label in labels.items():
        print(f"{label:<44} median {found[key]['median']:6.2f} s   max "
              f"{found[key]['max']:6.2f} s")
    duplicated = sum(r["duplicated_rows"] for r in runs)
    print(f"\nrows written twice at the target: {duplicated}; uncertain after the runs: "
          f"{sum(r['uncertain'] for r in runs)} of {args.leads * runs_wanted:,}")
    if not args.quick:
        record("failover", {"runs": runs, "summary": found, "leads": args.leads,
                            "batch_size": args.batch_size, "target_rate": args.target_rate,
                            "seconds": round(seconds, 1), "duplicated_rows": duplicated,
                            "machine_summary": machine()},
               script="-m bench failover", argv=argv)
    print(json.dumps({"summary": found, "duplicated_rows": duplicated}))
    return 1 if duplicated else 0


if __name__ == "__main__":
    sys.exit(main())
