"""What the dispatch path's log lines cost (issue 16): the same dispatch with its lines
going to a log file, and with the level raised so that no line per record or batch is
written.

    python -m bench logcost               # full: 5,000 events, 7 rounds; writes
                                          # bench/results/logcost-<UTC>.json
    python -m bench logcost --quick       # 1,000 events, 1 round (writes nothing)

For each store (SQLite, and PostgreSQL when the server answers) and each batch size
(``--batch-size 1`` and the default), N accepted events (N / 5 at batch size 1) are
delivered to the synthetic SQLite target by ``DurableWorker.run_cycle`` (the events
are accepted beforehand, untimed): once with JSON lines at ``info`` to a
``--log-file`` (a line per state change) and once at ``warning`` (no line for a
record that is confirmed).  Rounds are interleaved; a ratio is the median of the
per-round ratios, and the log's share of the dispatch is ``1 - logged / quiet``.
Each logged run also times its own logging (every line's record, format, write and
flush): its share of that run's dispatch time, measured inside one run and so far
less noisy on a shared machine than the ratio of two runs.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SCOPE, accept_then_deliver, compare, comparison_main
from bench.peers import PG_DSN, _drop
from runner.limits import DEFAULT_BATCH_SIZE

#: ``--batch-size 1`` delivers this share of N (it is many times slower; a rate is a rate)
SINGLE_SHARE = 5


#: per (PostgreSQL?, batch size, level): the share of each run's dispatch time spent
#: logging, measured inside the run (less noisy than the logged/quiet ratio of two runs)
SHARES: dict[tuple[bool, int, str], list[float]] = {}


async def _deliver(d: Path, n: int, db: str, batch: int, level: str) -> float:

    from runner import DurableWorker, logs
    from runner.io.synthetic_target import SyntheticTarget

    target = SyntheticTarget(str(d / "sheet.db"))
    n = n if batch > 1 else max(n // SINGLE_SHARE, 1)
    logs.configure("json", level, str(d / "runner.log"))
    inside = [0.0]  # seconds spent logging a line: the record, its format, write, flush
    _log = logging.Logger._log

    def timed(self: logging.Logger, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        try:
            _log(self, *args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - started

    logging.Logger._log = timed  # type: ignore[method-assign]
    try:
        async with DurableWorker(db, SCOPE, target, batch_size=batch) as worker:
            elapsed = await accept_then_deliver(worker, n)
            SHARES.setdefault((db.startswith("postgresql:"), batch, level), []).append(
                inside[0] / elapsed)
            return n / elapsed
    finally:
        logging.Logger._log = _log  # type: ignore[method-assign]
        logs.close()
        target.close()


def _sqlite(batch: int, level: str) -> Callable[[Path, int], float]:
    def run(d: Path, n: int) -> float:
        return asyncio.run(_deliver(d, n, str(d / "runner.db"), batch, level))
    return run


def _postgres(batch: int, level: str) -> Callable[[Path, int], float]:
    def run(d: Path, n: int) -> float:
        schema = "bench_logcost_" + uuid.uuid4().hex[:8]
        try:
            return asyncio.run(_deliver(d, n, f"{PG_DSN}?schema={schema}", batch, level))
        finally:
            asyncio.run(_drop(schema))
    return run


def _postgres_up() -> bool:
    async def probe() -> None:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN, timeout=5)
        await conn.close()

    try:
        asyncio.run(probe())
    except Exception:  # any failure: the server is not there for us
        return False
    return True


def measure(n: int, rounds: int) -> dict[str, Any]:
    contenders: dict[str, Callable[[Path, int], float]] = {}
    ratios: dict[str, tuple[str, str, float | None]] = {}
    skipped = []
    stores: list[tuple[str, Callable[[int, str], Callable[[Path, int], float]]]] = [
        ("SQLite", _sqlite)]
    if _postgres_up():
        stores.append(("PostgreSQL", _postgres))
    else:
        skipped.append(f"PostgreSQL: no server at {PG_DSN}")
    for store, make in stores:
        for batch in (1, DEFAULT_BATCH_SIZE):
            logged, quiet = (f"{store}, batch {batch}, log file",
                             f"{store}, batch {batch}, warning")
            contenders[logged] = make(batch, "info")
            contenders[quiet] = make(batch, "warning")
            ratios[f"{store}, batch {batch}: logged / quiet"] = (logged, quiet, None)
    SHARES.clear()
    doc = compare(contenders, n, rounds, ratios, skipped)
    doc["log_share"] = {name.split(":")[0]: None if value is None else 1 - value
                        for name, value in doc["ratios"].items()}
    doc["handler_share"] = {
        f"{'PostgreSQL' if pg else 'SQLite'}, batch {batch}":
            statistics.median(found)
        for (pg, batch, level), found in SHARES.items() if level == "info"}
    for name, share in doc["handler_share"].items():
        print(f"  {name}: {share:.1%} of the dispatch time writing log lines")
    return doc


def main(argv: list[str] | None = None) -> int:
    return comparison_main(argv, "logcost", "dispatch with and without its log lines",
                           __doc__.splitlines()[0], ((1_000, 1), (5_000, 7)), measure)


if __name__ == "__main__":
    sys.exit(main())
