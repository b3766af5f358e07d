"""Settling a crashed batch: one ``runner resolve --all`` against one ``runner resolve``
per record (issue 29 point 4).

A crash between a batch's in-flight commit and its request leaves the whole batch
uncertain with no row in the target.  For each size (1,000 and 5,000 records) and each
backend, a store is arranged that way through the CLI (``accept --records``, ``once
--fault crash-before-write --batch-size N``, then a plain ``once`` that recovers the batch
and reads it back: every record uncertain, no row), with ``SAMPLE`` more records crashed the
same way.  Then, timed as whole processes (``python run.py …``, interpreter start-up and
imports included, from the spawn to the exit):

* the per-record loop: ``resolve --write-id W --as not-sent`` for each of the ``SAMPLE``
  records, one process each (what an operator had before ``--all``); its mean per record,
  times N, is the loop's figure for N records (extrapolated);
* one ``resolve --all --as not-sent`` for the N others (the default ``--batch-size``).

Every decision is checked afterwards (N + SAMPLE ``failed_safe``, N + SAMPLE
``operator_resolved`` events).  On a shared machine a figure is only meaningful beside the
other figures of the same run: the ratio is the point.

    python -m bench resolve            # 1,000 and 5,000, SQLite and PostgreSQL; writes
                                       # bench/results/resolve-<UTC>.json
    python -m bench resolve --quick    # 200 records, a sample of 5 (writes nothing)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos_lane import drop_postgres_schema, postgres_location
from bench.common import SCOPE, event, machine, workdir
from bench.results import record

PG_DSN = "postgresql://root@127.0.0.1:5432/test"
RUN = str(Path(__file__).resolve().parent.parent / "run.py")
#: single resolves timed per size (their mean is extrapolated)
SAMPLE = 20
REASON = "bench: the batch request never left"


def cli(*args: str | Path, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    """Run ``python run.py ARGS`` as a whole process: (seconds from spawn to exit, stdout)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, RUN, *map(str, args)], capture_output=True,
                          text=True, timeout=900)
    seconds = time.perf_counter() - started
    if proc.returncode not in ok:
        raise SystemExit(f"{args[0]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return seconds, proc.stdout


def crash_batch(db: str, scope: Path, target: Path, events: Path, batch: int) -> None:
    cli("accept", "--db", db, "--scope", scope, "--records", events)
    cli("once", "--db", db, "--scope", scope, "--target", target, "--batch-size", str(batch),
        "--fault", "crash-before-write", ok=(73,))


def arrange(db: str, where: Path, n: int, sample: int) -> tuple[Path, list[str]]:
    """A store with ``n + sample`` uncertain records and no row; the sample's write_ids."""
    scope = where / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    target = where / "target.db"
    big, small = where / "big.ndjson", where / "small.ndjson"
    big.write_text("".join(json.dumps(event(i)) + "\n" for i in range(n)))
    small.write_text("".join(json.dumps(event(i)) + "\n" for i in range(n, n + sample)))
    crash_batch(db, scope, target, small, sample)
    crash_batch(db, scope, target, big, n)
    cli("once", "--db", db, "--scope", scope, "--target", target)  # recovers, reads back
    _, out = cli("uncertain", "--db", db)
    doc = json.loads(out)
    if doc["count"] != n + sample:
        raise SystemExit(f"arranged {doc['count']} uncertain records, not {n + sample}")
    keys = {f"lead-{i:08d}" for i in range(n, n + sample)}
    return target, [r["write_id"] for r in doc["records"] if r["source_lead_id"] in keys]


def measure(backend: str, n: int, sample: int) -> dict[str, Any]:
    with workdir() as where:
        if backend == "sqlite":
            db = str(where / "queue.db")
        else:
            db = postgres_location(PG_DSN, f"bench_resolve_{n}_{int(time.time())}")
        try:
            target, ids = arrange(db, where, n, sample)
            singles = [cli("resolve", "--db", db, "--target", target, "--write-id", w,
                           "--as", "not-sent", "--reason", REASON)[0] for w in ids]
            all_s, out = cli("resolve", "--all", "--db", db, "--target", target,
                             "--as", "not-sent", "--reason", REASON)
            answer = json.loads(out)
            _, status = cli("status", "--db", db)
            doc = json.loads(status)
        finally:
            if backend == "postgres":
                drop_postgres_schema(db)
    per_record = sum(singles) / len(singles)
    settled = doc["counts"]["failed_safe"] == n + sample
    events = doc["outbox"]["by_kind"].get("operator_resolved", 0) == n + sample
    if not (answer["decided"] == n and settled and events):
        raise SystemExit(f"{backend} {n}: not every record was decided: {answer}")
    loop_s = per_record * n
    return {"backend": backend, "records": n, "resolve_all_s": round(all_s, 3),
            "resolve_all_per_s": round(n / all_s, 1), "chunks": answer["chunks"],
            "single_sample": sample, "single_mean_s": round(per_record, 4),
            "single_loop_s_extrapolated": round(loop_s, 1),
            "ratio_loop_to_all": round(loop_s / all_s, 1)}


def postgres_available() -> str | None:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed"
    proc = subprocess.run([sys.executable, RUN, "status", "--db",
                           postgres_location(PG_DSN, "bench_resolve_probe")],
                          capture_output=True, text=True, timeout=60)
    return None if proc.returncode in (0, 66) else proc.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 records, a sample of 5")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args(argv)
    sizes, sample = ([200], 5) if args.quick else ([1000, 5000], SAMPLE)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    skipped: list[str] = []
    if "postgres" in backends and (why := postgres_available()) is not None:
        backends.remove("postgres")
        skipped.append(f"postgres: {why}")
    started = time.perf_counter()
    rows = [measure(b, n, sample) for b in backends for n in sizes]
    print(f"resolve --all vs one resolve per record, whole processes ({machine()})")
    for r in rows:
        print(f"{r['backend']:9} {r['records']:>6,} records: resolve --all "
              f"{r['resolve_all_s']:6.2f} s ({r['chunks']} chunks); one resolve per record "
              f"{r['single_mean_s'] * 1000:5.0f} ms each (mean of {r['single_sample']}), "
              f"{r['single_loop_s_extrapolated']:7.1f} s for {r['records']:,} "
              f"(extrapolated); ratio {r['ratio_loop_to_all']:.0f}")
    for line in skipped:
        print(f"skipped {line}")
    doc = {"sizes": sizes, "sample": sample, "rows": rows, "skipped": skipped,
           "seconds": round(time.perf_counter() - started, 1), "summary": machine()}
    print(json.dumps(doc, separators=(",", ":")))
    if not args.quick:
        record("resolve", doc, script="-m bench resolve", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
