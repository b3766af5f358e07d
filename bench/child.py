"""Child processes for the harnesses; each drives the library like a small real client.

``python bench/child.py accept DB SCOPE PREFIX FIRST LAST``
    accept events PREFIX-FIRST .. PREFIX-(LAST-1), printing one JSON line per answer,
    flushed as soon as it is given (so a crash leaves exactly the acknowledged keys);
``python bench/child.py setup DB SCOPE TARGET PREFIX N OUTAGE OK TIMEOUT``
    accept PREFIX-0 .. PREFIX-(N-1) as above, then three cycles that send OUTAGE records
    under ``--fault outage`` (failed_safe), then OK records normally (failed_safe ones
    first, in accept order), then TIMEOUT records under ``--fault timeout`` (uncertain,
    with a row), to leave a mix of states behind.
"""

from __future__ import annotations

import json
import sys
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
                async with DurableWorker(db, scope, adapter) as worker:
                    await worker.run_cycle(dispatch_limit=n)
    finally:
        sheet.close()


def main(argv: list[str]) -> None:
    mode, db, scope_path, *rest = argv
    scope = json.loads(Path(scope_path).read_text(encoding="utf-8"))
    if mode == "accept":
        prefix, first, last = rest[0], int(rest[1]), int(rest[2])
        anyio.run(accept, db, scope, prefix, first, last)
    elif mode == "setup":
        anyio.run(accept, db, scope, rest[1], 0, int(rest[2]))
        anyio.run(warm, db, scope, rest[0], [int(n) for n in rest[3:6]])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
