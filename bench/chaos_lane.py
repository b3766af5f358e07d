"""One chaos episode's directory, processes and audits (used by ``bench/chaos.py``)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.invariants import DELETED_TABLE, Audit, audit, is_postgres, query
from runner.crashpoints import POINTS

ROOT = Path(__file__).resolve().parent.parent
RUN = str(ROOT / "run.py")
CHILD = str(ROOT / "bench" / "child.py")
SCOPE = {"tenant_id": "chaos-tenant", "account_id": "chaos-account",
         "page_id": "chaos-page", "form_id": "chaos-form"}
WORKER_POINTS = [p for p in POINTS if not p.startswith(("accept.", "sweep.", "resolve."))]
STATUSES = ("contacted", "qualified", "won", "lost")
SWEEP_AT = "2026-01-01T00:10:00Z"  # ten minutes after bench/child.py's candidates (T0)
TIMEOUT = 120


@dataclass
class Episode:
    index: int
    point: str
    fired: bool = False
    restart_crashed: bool = False
    states: Counter[str] = field(default_factory=Counter)
    rows: int = 0
    recovered: int = 0
    candidates: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    directory: str = ""
    faults: list[str] = field(default_factory=list)  # --http-target: the server's faults
    #: --http-target: what the faulty server did (its "stopped:" line): appends, rows,
    #: throttled, dropped
    served: Counter[str] = field(default_factory=Counter)


class Lane:
    """One episode's directory, processes and audits."""

    def __init__(self, directory: Path, episode: Episode, db: str | None = None) -> None:
        self.dir = directory
        self.db = db or str(directory / "queue.db")  # a file, or a postgresql:// location
        self.target = directory / "target.db"
        self.scope = directory / "scope.json"
        self.scope.write_text(json.dumps(SCOPE), encoding="utf-8")
        self.ep = episode
        self.acked: set[str] = set()
        #: the --target of worker commands: the sheet file, or the URL of a reference
        #: server serving it (``bench/chaos.py --http-target``)
        self.target_arg = str(self.target)

    def proc(self, argv: list[str], env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_CRASH")}
        try:
            return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                                  env={**full, **(env or {})}, timeout=TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            self.ep.violations.append(f"hung: {' '.join(argv[1:3])}")
            return subprocess.CompletedProcess(argv, -1, "", "")

    def cli(self, command: str, *extra: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        args = [RUN, command, "--db", str(self.db), "--scope", str(self.scope)]
        if command != "accept":
            args += ["--target", self.target_arg]
        return self.proc([*args, *extra], env)

    def expect(self, step: str, proc: subprocess.CompletedProcess[str], *codes: int) -> None:
        if proc.returncode not in codes:
            tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            self.ep.violations.append(f"{step}: exit {proc.returncode}: {tail}")

    def check(self, step: str, *, in_flight_ok: bool) -> Audit:
        result = audit(self.db, self.target, accepted=self.acked, in_flight_ok=in_flight_ok)
        self.ep.violations += [f"{step}: {v}" for v in result.violations]
        return result

    def setup(self, prefix: str, n: int, counts: list[int], candidates: str) -> None:
        """Accept n leads, leave a mix of states behind, add candidates (``child.py``)."""
        proc = self.proc([CHILD, "setup", str(self.db), str(self.scope), str(self.target),
                          prefix, str(n), *map(str, counts), candidates])
        self.expect("setup", proc, 0)
        for line in proc.stdout.splitlines():
            answer = json.loads(line)
            if answer["result"] in ("accepted", "duplicate"):
                self.acked.add(answer["key"])

    def unswept(self) -> int:
        """Candidates a completed sweep at ``SWEEP_AT`` would have moved."""
        rows = query(self.db, "SELECT count(*) FROM {t}candidates WHERE status = 'promoting' "
                     "OR (status IN ('discovered', 'analyzing') AND expires_at < ?)",
                     SWEEP_AT.replace("Z", ".000000Z"))
        return int(rows[0][0]) if rows else 0

    def confirmed_keys(self) -> list[str]:
        return [k for (k,) in query(self.db, "SELECT source_lead_id FROM {t}leads "
                                             "WHERE state = 'confirmed' ORDER BY seq")]

    def play_crm(self, rng: random.Random) -> None:
        """Statuses change; sometimes the CRM deletes a confirmed lead (kept aside)."""
        if not self.target.exists():
            return
        confirmed = self.confirmed_keys()
        conn = sqlite3.connect(self.target, isolation_level=None)
        try:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {DELETED_TABLE} AS SELECT * FROM sheet "
                         "WHERE 0")
            for (row_id,) in conn.execute("SELECT row_id FROM sheet").fetchall():
                if rng.random() < 0.3:
                    conn.execute("UPDATE sheet SET status = ? WHERE row_id = ?",
                                 (rng.choice(STATUSES), row_id))
            if confirmed and rng.random() < 0.3:
                key = rng.choice(confirmed)
                conn.execute("BEGIN")
                conn.execute(f"INSERT INTO {DELETED_TABLE} SELECT * FROM sheet "
                             "WHERE source_lead_id = ?", (key,))
                conn.execute("DELETE FROM sheet WHERE source_lead_id = ?", (key,))
                conn.execute("COMMIT")
        finally:
            conn.close()


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--pg-dsn``, as the chaos and kill -9 harnesses take them."""
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-dsn", default=os.environ.get(
        "RUNNER_TEST_PG_DSN", "postgresql://root@127.0.0.1:5432/test"),
        help="the PostgreSQL server for --backend postgres (one schema per run)")


def postgres_location(dsn: str, schema: str) -> str:
    """A store location in its own schema on the server at ``dsn``."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(query=urlencode([*parse_qsl(parts.query),
                                                      ("schema", schema)])))


def drop_postgres_schema(location: str) -> None:
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> None:
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {where.schema_ident} CASCADE")
        finally:
            await conn.close()

    if is_postgres(location):
        asyncio.run(go())
