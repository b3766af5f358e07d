"""Child processes for the harnesses; each drives the library like a small real client.

``python bench/child.py accept DB SCOPE PREFIX FIRST LAST``
    accept events PREFIX-FIRST .. PREFIX-(LAST-1), printing one JSON line per answer,
    flushed as soon as it is given (so a crash leaves exactly the acknowledged keys);
``python bench/child.py setup DB SCOPE TARGET PREFIX N OUTAGE OK TIMEOUT [CANDIDATES]``
    accept PREFIX-0 .. PREFIX-(N-1) as above, then three cycles that send OUTAGE records
    under ``--fault outage`` (failed_safe), then OK records normally (failed_safe ones
    first, in accept order), then TIMEOUT records under ``--fault timeout`` (uncertain,
    with a row), to leave a mix of states behind; then one candidate per letter of
    CANDIDATES, created at ``T0``: ``d`` discovered (expires after a minute), ``a``
    analyzing, ``p`` promoting without a decision, ``q`` promoting with one, ``l`` a
    long-lived one (see ``add_candidates``).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from runner import DurableWorker
from runner.io.faults import Fault, FaultyAdapter
from runner.io.synthetic_target import SyntheticTarget


def lead(scope: dict[str, str], key: str) -> dict[str, Any]:
    return {**scope, "source": "meta", "source_lead_id": key, "synthetic": True,
            "contact_alias": f"synthetic-alias-{key}"}


async def accept(db: str, scope: dict[str, str], prefix: str, first: int, last: int) -> None:
    async with DurableWorker(db, scope) as worker:
        for i in range(first, last):
            result = await worker.accept(lead(scope, f"{prefix}-{i}"))
            sys.stdout.write(json.dumps({"key": result.source_lead_id,
                                         "result": result.result}) + "\n")
            sys.stdout.flush()


async def warm(db: str, scope: dict[str, str], target: str, counts: list[int]) -> None:
    sheet = SyntheticTarget(target)
    try:
        for faults, n in zip(([Fault.OUTAGE], [], [Fault.TIMEOUT]), counts, strict=True):
            if n:
                adapter = FaultyAdapter(sheet, frozenset(faults))
                # retry_base 0: records not sent are due again at the next cycle (the
                # states this warm-up leaves do not wait on a backoff)
                async with DurableWorker(db, scope, adapter, retry_base=0) as worker:
                    await worker.run_cycle(dispatch_limit=n)
    finally:
        sheet.close()


T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def add_candidates(db: str, spec: str) -> None:
    """Candidates for the sweep to act on at ``T0`` + 10 minutes."""
    from runner.candidates import rules
    from runner.io.stores import open_store

    async with await open_store(db) as store:
        for n, kind in enumerate(spec):
            cid = f"cand-{n}-{kind}"
            ttl = timedelta(minutes=1000 if kind == "l" else 1 if kind == "d" else 5)
            await store.add_candidate(rules.new_candidate(cid, T0, ttl=ttl))
            if kind in "apq":
                for analyst in ("ann", "bob")[: 1 if kind == "a" else 2]:
                    await store.analyze_candidate(cid, analyst, T0)
            if kind in "pq":
                await store.begin_promotion(cid, T0)
            if kind == "q":
                await store.record_decision(cid, f"decision-{n}", T0)


def main(argv: list[str]) -> None:
    mode, db, scope_path, *rest = argv
    scope = json.loads(Path(scope_path).read_text(encoding="utf-8"))
    if mode == "accept":
        prefix, first, last = rest[0], int(rest[1]), int(rest[2])
        anyio.run(accept, db, scope, prefix, first, last)
    elif mode == "setup":
        anyio.run(accept, db, scope, rest[1], 0, int(rest[2]))
        anyio.run(warm, db, scope, rest[0], [int(n) for n in rest[3:6]])
        if len(rest) > 6:
            anyio.run(add_candidates, db, rest[6])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
