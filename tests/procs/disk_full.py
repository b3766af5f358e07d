"""Child: accept and cycle on a store whose disk runs out of space (issue 8.3).

Usage: python -m tests.procs.disk_full DIR MODE ASIDE [SLACK_KIB,...]

Stores live in DIR; event files and the synthetic targets live in ASIDE, on another disk
(a full target is the target's business, not the store's).

MODE ``tmpfs``: DIR is a small tmpfs this process may fill (the test mounts one in a
private mount namespace); a ballast file takes the free space, deleting it frees it.
MODE ``pages``: DIR is an ordinary directory; ``$RUNNER_SQLITE_MAX_PAGES=1`` caps the
store at its current size (SQLite returns SQLITE_FULL), dropping it frees the space.

Prints one JSON report: what happened and every violation found.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import RUN, SCOPE, event, run_main, write_json

CHUNK = 4096


class Disk:
    def __init__(self, root: Path, mode: str) -> None:
        self.root, self.mode = root, mode
        self.env: dict[str, str] = {}

    def fill(self, slack: int = 0) -> None:
        """Take every free byte but ``slack``."""
        if self.mode == "pages":
            self.env = {"RUNNER_SQLITE_MAX_PAGES": "1"}
            return
        fd = os.open(self.root / "ballast", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while os.write(fd, b"\0" * CHUNK):
                pass
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        if slack:
            size = (self.root / "ballast").stat().st_size
            os.truncate(self.root / "ballast", max(0, size - slack))

    def free(self) -> None:
        self.env = {}
        (self.root / "ballast").unlink(missing_ok=True)


def ingest(db: Path, n: int) -> None:
    """Accept ``event(0..n-1)`` in this process, through the library (arranging: the acts
    on a full disk are CLI processes)."""
    import anyio

    from runner import DurableWorker

    async def go() -> None:
        async with DurableWorker(str(db), SCOPE) as worker:
            for i in range(n):
                assert (await worker.accept(event(i))).ok

    anyio.run(go)


def cli(disk: Disk, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, RUN, *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, **disk.env}, timeout=120, check=False)


def query(db: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def accept_when_full(disk: Disk, work: Path, aside: Path, report: dict[str, Any]) -> None:
    db, scope = work / "queue.db", write_json(aside / "scope.json", SCOPE)
    bad = report["violations"]
    ingest(db, 1)  # arranged in process, with space
    disk.fill()
    for i in range(1, 80):  # with a page cap, the first accepts still fit in free pages
        rec = write_json(aside / f"e{i}.json", event(i))
        # found in process (``main()``), then the refused accept again as a real process
        probe = run_main("accept", "--db", db, "--scope", scope, "--record", rec,
                         env=disk.env)
        if probe.returncode != 0:
            break
    else:
        bad.append("the store never ran out of space")
        return
    if probe.returncode != 74:
        bad.append(f"accept on a full store in process: exit {probe.returncode}")
    refused = cli(disk, "accept", "--db", db, "--scope", scope, "--record", rec)
    report["refused"] = {"exit": refused.returncode, "stdout": refused.stdout,
                         "stderr": refused.stderr.strip()}
    disk.free()
    key = f"lead-{i}"
    if query(db, f"SELECT count(*) FROM leads WHERE source_lead_id = '{key}'")[0][0]:
        bad.append(f"{key} was stored although its accept failed")
    if query(db, f"SELECT count(*) FROM outbox WHERE subject = '{key}'")[0][0]:
        bad.append(f"an outbox event for {key} was stored although its accept failed")
    if query(db, "PRAGMA integrity_check")[0][0] != "ok":
        bad.append("integrity_check failed after the full accept")
    again = cli(disk, "accept", "--db", db, "--scope", scope, "--record", rec)
    report["retried"] = json.loads(again.stdout or "{}").get("result")


def cycle_when_full(disk: Disk, work: Path, aside: Path, slack: int,
                    report: dict[str, Any]) -> None:
    work.mkdir(mode=0o700)
    db, target = work / "queue.db", aside / f"{work.name}-target.db"
    scope = write_json(aside / "scope.json", SCOPE)
    bad = report["violations"]
    ingest(db, 20)
    disk.fill(slack)
    full = cli(disk, "once", "--db", db, "--scope", scope, "--target", target)
    disk.free()
    states = dict(query(db, "SELECT source_lead_id, state FROM leads"))
    rows = dict(query(target, "SELECT source_lead_id, count(*) FROM sheet GROUP BY 1")
                ) if target.exists() else {}
    report["cycles"].append({
        "slack": slack, "exit": full.returncode, "stderr": full.stderr.strip()[-300:],
        "in_flight_with_row": sum(1 for k, s in states.items() if s == "in_flight" and k in rows),
        "sent": len(rows)})
    if full.returncode not in (0, 74):
        bad.append(f"cycle on a full store (slack {slack}): exit {full.returncode}")
    healed = cli(disk, "once", "--db", db, "--scope", scope, "--target", target)
    if healed.returncode != 0:
        bad.append(f"cycle after freeing space: exit {healed.returncode}: {healed.stderr}")
    rows = dict(query(target, "SELECT source_lead_id, count(*) FROM sheet GROUP BY 1"))
    for key, state, attempts in query(db, "SELECT source_lead_id, state, attempts FROM leads"):
        if rows.get(key, 0) > 1:
            bad.append(f"slack {slack}: {key} was sent twice")
        if state != "confirmed" and not (state == "uncertain" and key not in rows):
            bad.append(f"slack {slack}: {key} ended {state} with {rows.get(key, 0)} rows")
        if attempts != 1:
            bad.append(f"slack {slack}: {key} has attempts={attempts}")
    if query(db, "PRAGMA integrity_check")[0][0] != "ok":
        bad.append(f"slack {slack}: integrity_check failed")
    shutil.rmtree(work)  # give the space back for the next round


#: the free space left (KiB) when a cycle starts on a full tmpfs: each runs out at another
#: commit of the cycle
SLACKS = [0, 16, 32, 40, 48, 64, 96, 128]


def main(root: Path, mode: str, aside: Path, slacks: list[int] | None = None
         ) -> dict[str, Any]:
    disk = Disk(root, mode)
    report: dict[str, Any] = {"mode": mode, "violations": [], "cycles": []}
    first = root / "accept"
    first.mkdir(mode=0o700)
    accept_when_full(disk, first, aside, report)
    disk.free()
    slacks = (slacks or SLACKS) if mode == "tmpfs" else [0]
    for n, slack in enumerate(slacks):
        cycle_when_full(disk, root / f"cycle-{n}", aside, slack * 1024, report)
        disk.free()
    return report


if __name__ == "__main__":
    chosen = [int(k) for k in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), chosen)))
