"""Accept at scale (issue 21 point 4): bulk accept rate over the first chunk of a store
against the rate over its last chunk, on both backends.

    python -m bench accept-scale          # full: 1,000,000 leads in chunks of 100,000;
                                          # writes bench/results/accept-scale-<UTC>.json
    python -m bench accept-scale --quick  # 100,000 leads in chunks of 10,000 (writes nothing)

Each chunk is one ``runner accept --records -`` child (the events on stdin, one answer per
event after its commit, process start-up included), into the same store, so the last
chunk lands in a store that already holds ``n - chunk`` leads. The store is created and
migrated beforehand by an empty accept, untimed, so the first chunk does not carry the
schema's creation that the last one does not have. The figure is
``rate(last chunk) / rate(first chunk)`` per backend: 1.0 means accept does not slow as
the store grows. ``--random-keys`` draws the source keys at random (real keys come from
the source and need not arrive in order) instead of the bench's sequential ones, and
records ``bench/results/accept-scale-random-<UTC>.json``.

    python -m bench accept-scale --matrix [--rounds 2]   # the choice behind runner's
                                          # settings: write_id form x SQLite page cache,
                                          # interleaved; bench/results/accept-scale-matrix-*

``--matrix`` runs each variant (write_id form: random version 4 or time-ordered version 7
UUIDs; SQLite page cache: 32 or 128 MiB) in the child by patching runner before it starts,
so every variant runs the same code otherwise; rounds alternate the order of the variants
and each figure is the median over the rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, RUN, SCOPE, event, machine, workdir
from bench.ingest import PG_DSN, _drop_pg


def _lines(n: int, first: int, random_keys: bool) -> bytes:
    out = []
    for i in range(first, first + n):
        doc = event(i)
        if random_keys:
            doc["source_lead_id"] = f"lead-{uuid.uuid4().hex}"
        out.append(json.dumps(doc))
    return ("\n".join(out) + "\n").encode()


def _accept(db: str, scope: Path, data: bytes, n: int, prelude: str) -> float:
    """One ``runner accept`` child; its rows/s. ``prelude`` (experiments only) runs first."""
    args = ["accept", "--db", db, "--scope", str(scope), "--records", "-"]
    cmd = ([sys.executable, "-c", prelude + "\nimport runpy, sys\nsys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')", RUN, *args] if prelude
           else [sys.executable, RUN, *args])
    started = time.perf_counter()
    proc = subprocess.run(cmd, input=data, capture_output=True, check=False, cwd=ROOT)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or proc.stdout.count(b'"accepted"') != n:
        raise RuntimeError(f"accept failed ({proc.returncode}): {proc.stderr[-500:]!r}")
    return n / wall


def grow(db: str, directory: Path, n: int, chunk: int, *, random_keys: bool = False,
         prelude: str = "") -> list[float]:
    """Fill one store to ``n`` leads, ``chunk`` at a time; the rate of each chunk."""
    scope = directory / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    # an empty accept first, untimed: it creates and migrates the store and pins the
    # scope, so the first chunk's rate is accepting, as the last one's is
    _accept(db, scope, b"", 0, prelude)
    return [_accept(db, scope, _lines(chunk, first, random_keys), chunk, prelude)
            for first in range(0, n, chunk)]


def run_backend(backend: str, n: int, chunk: int, *, random_keys: bool = False,
                prelude: str = "") -> list[float]:
    with workdir() as d:
        if backend == "SQLite":
            return grow(str(d / "runner.db"), d, n, chunk, random_keys=random_keys,
                        prelude=prelude)
        schema = "bench_scale_" + uuid.uuid4().hex[:8]
        try:
            return grow(f"{PG_DSN}?schema={schema}", d, n, chunk, random_keys=random_keys,
                        prelude=prelude)
        finally:
            _drop_pg(schema)


_V4 = """
import os
import runner.leads.intake as _i
def _ids(n):
    t = os.urandom(16 * n).hex()
    return [_i.WriteId(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_i._VARIANT[h[16]]}{h[17:20]}-{h[20:32]}")
            for h in (t[i:i + 32] for i in range(0, 32 * n, 32))]
_i.new_write_ids = _ids
_i.new_write_id = lambda: _ids(1)[0]
"""
_V7 = """
import os, time
import runner.leads.intake as _i
def _ids(n):
    s = f"{time.time_ns() // 1_000_000:012x}"
    t = os.urandom(10 * n).hex()
    return [_i.WriteId(f"{s[:8]}-{s[8:]}-7{h[:3]}-{_i._VARIANT[h[3]]}{h[4:7]}-{h[7:19]}")
            for h in (t[i:i + 20] for i in range(0, 20 * n, 20))]
_i.new_write_ids = _ids
_i.new_write_id = lambda: _ids(1)[0]
"""


def _cache(kib: int) -> str:
    return f"import runner.io.sqlite.connection as _c\n_c.CACHE_KIB = {kib}\n"


#: backend -> variant -> prelude (the page cache is SQLite's; PostgreSQL's is the server's)
VARIANTS = {
    "SQLite": {"uuid4, 32 MiB": _V4 + _cache(32 * 1024), "uuid7, 32 MiB": _V7 + _cache(32 * 1024),
               "uuid4, 128 MiB": _V4 + _cache(128 * 1024),
               "uuid7, 128 MiB": _V7 + _cache(128 * 1024)},
    "PostgreSQL": {"uuid4": _V4, "uuid7": _V7},
}


def matrix(backends: list[str], n: int, chunk: int, rounds: int) -> dict[str, Any]:
    found: dict[str, dict[str, list[list[float]]]] = {
        b: {v: [] for v in VARIANTS[b]} for b in backends}
    for r in range(rounds):
        for b in backends:
            names = list(VARIANTS[b]) if r % 2 == 0 else list(VARIANTS[b])[::-1]
            for v in names:
                rates = run_backend(b, n, chunk, prelude=VARIANTS[b][v])
                found[b][v].append(rates)
                s = summary(rates)
                print(f"  round {r + 1} {b} {v}: first {s['first']:,.0f} last "
                      f"{s['last']:,.0f} rows/s, last/first {s['ratio']:.2f}",
                      file=sys.stderr, flush=True)
    return {b: {v: {"runs": runs,
                    "first": statistics.median(x[0] for x in runs),
                    "last": statistics.median(x[-1] for x in runs),
                    "ratio": statistics.median(summary(x)["ratio"] for x in runs)}
                for v, runs in per.items()} for b, per in found.items()}


def summary(rates: list[float]) -> dict[str, float]:
    return {"first": rates[0], "last": rates[-1], "ratio": rates[-1] / rates[0]}


GOAL = 0.85  # within 15% of the rate at the start


def main(argv: list[str] | None = None) -> int:
    import argparse

    from bench.results import record

    parser = argparse.ArgumentParser(prog="python -m bench accept-scale",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="100,000 leads in chunks of 10,000, writes nothing")
    parser.add_argument("--random-keys", action="store_true",
                        help="random source keys instead of sequential ones")
    parser.add_argument("--backend", choices=("SQLite", "PostgreSQL"), action="append",
                        help="only this backend (repeatable; default both)")
    parser.add_argument("--matrix", action="store_true",
                        help="compare write_id forms and page caches (see above)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --matrix")
    args = parser.parse_args(argv)
    n, chunk = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    backends = args.backend or ["SQLite", "PostgreSQL"]
    started = time.perf_counter()
    if args.matrix:
        doc = matrix(backends, n, chunk, args.rounds)
        seconds = time.perf_counter() - started
        print(f"accept at scale by variant, {n:,} leads in chunks of {chunk:,}, median of "
              f"{args.rounds} interleaved round(s); {machine()}; {seconds:.0f} s\n")
        for b, per in doc.items():
            for v, m in per.items():
                print(f"  {b:<11} {v:<15} first {m['first']:>8,.0f}  last {m['last']:>8,.0f} "
                      f"rows/s  last/first {m['ratio']:.2f}")
        if not args.quick:
            record("accept-scale-matrix", {"n": n, "chunk": chunk, "rounds": args.rounds,
                                           "seconds": round(seconds), "backends": doc},
                   script="-m bench accept-scale", argv=argv)
        return 0
    found = {b: run_backend(b, n, chunk, random_keys=args.random_keys) for b in backends}
    seconds = time.perf_counter() - started
    keys = "random" if args.random_keys else "sequential"
    print(f"accept at scale, {n:,} leads in chunks of {chunk:,}, {keys} keys; {machine()}; "
          f"{seconds:.0f} s\n")
    ok = True
    for backend, rates in found.items():
        s = summary(rates)
        ok = ok and s["ratio"] >= GOAL
        print(f"  {backend:<11} first {chunk:,}: {s['first']:>8,.0f} rows/s   last {chunk:,} "
              f"(at {n:,}): {s['last']:>8,.0f} rows/s   last/first {s['ratio']:.2f} "
              f"(goal >= {GOAL})")
    if not args.quick:
        kind = "accept-scale-random" if args.random_keys else "accept-scale"
        record(kind, {"n": n, "chunk": chunk, "keys": keys, "goal": GOAL,
                      "cache_kib": _cache_kib(), "seconds": round(seconds),
                      "backends": {b: {"rates": r, **summary(r)} for b, r in found.items()}},
               script="-m bench accept-scale", argv=argv)
    return 0 if ok else 1


def _cache_kib() -> int:
    from runner.io.sqlite.connection import CACHE_KIB

    return CACHE_KIB


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
