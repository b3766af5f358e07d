"""Child process: accept events FIRST..LAST through the library, one commit each.

Usage: python -m tests.procs.accept_many DB FIRST LAST [GO_FILE]
Waits until GO_FILE exists (so several children start together), prints a JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio

from runner import DurableWorker
from tests.helpers import SCOPE, event


def wait_for(go: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("never got the go signal")
        time.sleep(0.002)


async def main(db: str, first: int, last: int) -> None:
    counts: dict[str, int] = {}
    async with DurableWorker(db, SCOPE) as worker:
        for i in range(first, last):
            result = await worker.accept(event(i))
            counts[result.result] = counts.get(result.result, 0) + 1
    print(json.dumps(counts))


if __name__ == "__main__":
    db, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        wait_for(sys.argv[4])
    anyio.run(main, db, first, last)
