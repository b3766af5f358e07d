"""Ingest at the limit (issue 21): bulk accept on both backends, side by side with the
floors and PgQueuer, on the same events in the same run.

    python -m bench ingest                # full: 100,000 events, 3 rounds; writes
                                          # bench/results/ingest-<UTC>.json
    python -m bench ingest --quick        # 10,000 events, 1 round (writes nothing)

Every contender takes the same NDJSON events (synthetic, distinct keys) and makes each one
durable, de-duplicated by its key, before it counts:

* **runner SQLite / PostgreSQL**: the path ``runner accept --records FILE`` takes
  (``runner.commands.bulk.accept_records``: a reader thread, strict parse, validation,
  canonical JSON, a write_id, grouped commits, one JSON answer line per event written
  after its commit), in this process, like the floors. The store is created and
  migrated (and the scope pinned) before the clock starts, as the floors create their
  tables and PgQueuer its schema (``install()``) untimed; the events are read from a file
  and the answers written to a file;
* **runner … (CLI child)**: ``runner accept --records -`` in a child process, the events
  on stdin, the answers on stdout, timed from spawn to exit: interpreter start-up,
  imports, the session, the schema check and the scope check included.  Its bytecode is
  compiled, as an installed package has it (``bench.common.compiled_env``: a private
  cache, warmed by one untimed child per store before the rounds).  The store is created
  and migrated beforehand, untimed, as the floors' tables and PgQueuer's schema are; the
  PostgreSQL goals (issue 32.3) are on this row, whole process against the peer and the
  floor from their first insert;
* **runner PostgreSQL (CLI child, new store)**: the same on a schema that does not exist
  yet, so the child also creates and migrates the store: printed beside it, not used for
  a goal;
* **stdlib floor**: the same work with the standard library only, in this process: parse
  each line, canonical JSON, an id, ``INSERT OR IGNORE`` into a SQLite table keyed by
  (tenant, lead), 1,000 rows per transaction, one answer line per row;
* **PostgreSQL floor**: the same per-row work, then one ``unnest`` insert of 1,000 rows per
  transaction into a bare table keyed the same way (``ON CONFLICT DO NOTHING``);
* **PgQueuer** (from the optional ``.[bench]`` extra; skipped, saying so, when it is not
  installed, and a full run without it writes no results file): ``Queries.enqueue`` in
  batches of 1,000 with ``dedupe_key`` = the lead key, on the same server, in a schema of
  its own.

Every PostgreSQL session runs with ``synchronous_commit = on`` (set on the floor's and
PgQueuer's sessions, the server's default that runner keeps): each commit waits for its
WAL flush on every side (checked before the first round).  Rounds are interleaved (each
contender once per round) so that all of them see the same disk and server weather; each
figure is the median over the rounds and each ratio the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SCOPE, compare, comparison_main, compiled_env, event, run_child

PG_DSN = "postgresql://root@127.0.0.1:5432/test"
#: the same durability on every side: each commit waits for its WAL flush
DURABLE = {"synchronous_commit": "on"}
PER_TXN = 1000


def _lines(n: int, first: int) -> list[bytes]:
    return [json.dumps(event(first + i)).encode() for i in range(n)]


def _prepare_rows(lines: list[bytes]) -> list[tuple[str, str, str, str]]:
    """The floor's per-row work: parse, canonical JSON, an id."""
    rows = []
    for line in lines:
        doc = json.loads(line)
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        rows.append((doc["tenant_id"], doc["source_lead_id"], canonical, str(uuid.uuid4())))
    return rows


def stdlib_floor(directory: Path, lines: list[bytes]) -> float:
    conn = sqlite3.connect(directory / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE leads (tenant_id TEXT NOT NULL, source_lead_id TEXT NOT NULL, "
                 "canonical TEXT NOT NULL, write_id TEXT NOT NULL, "
                 "PRIMARY KEY (tenant_id, source_lead_id))")
    with open(directory / "floor.answers", "w", encoding="utf-8") as out:
        started = time.perf_counter()
        for start in range(0, len(lines), PER_TXN):
            rows = _prepare_rows(lines[start:start + PER_TXN])
            conn.execute("BEGIN")
            conn.executemany("INSERT OR IGNORE INTO leads VALUES (?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
            for _, key, _, write_id in rows:
                out.write(json.dumps({"result": "accepted", "source_lead_id": key,
                                      "write_id": write_id}) + "\n")
        out.flush()
        elapsed = time.perf_counter() - started
    conn.close()
    return len(lines) / elapsed


async def _pg_floor(lines: list[bytes]) -> float:
    import asyncpg

    schema = "bench_floor_" + uuid.uuid4().hex[:8]
    conn = await asyncpg.connect(PG_DSN, server_settings=DURABLE)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.leads ("
                           "tenant_id text NOT NULL, source_lead_id text NOT NULL, "
                           "canonical text NOT NULL, write_id text NOT NULL, "
                           "PRIMARY KEY (tenant_id, source_lead_id))")
        insert = (f"INSERT INTO {schema}.leads SELECT * FROM unnest($1::text[], $2::text[], "
                  "$3::text[], $4::text[]) ON CONFLICT DO NOTHING")
        answers = []
        started = time.perf_counter()
        for start in range(0, len(lines), PER_TXN):
            rows = _prepare_rows(lines[start:start + PER_TXN])
            columns = [list(c) for c in zip(*rows, strict=True)]
            await conn.execute(insert, *columns)
            answers += [json.dumps({"result": "accepted", "source_lead_id": key,
                                    "write_id": write_id}) for _, key, _, write_id in rows]
        elapsed = time.perf_counter() - started
        assert len(answers) == len(lines)
        return len(lines) / elapsed
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


async def _pgqueuer(lines: list[bytes]) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    schema = "bench_pgq_" + uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(PG_DSN)
    await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema,
                                                                 **DURABLE})
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            started = time.perf_counter()
            for start in range(0, len(lines), PER_TXN):
                chunk = lines[start:start + PER_TXN]
                keys = [json.loads(line)["source_lead_id"] for line in chunk]
                await queries.enqueue(["ingest"] * len(chunk), list(chunk), [0] * len(chunk),
                                      dedupe_key=list(keys))
            elapsed = time.perf_counter() - started
            queued = await conn.fetchval(f"SELECT count(*) FROM {schema}.pgqueuer")
            assert queued == len(lines), queued
            return len(lines) / elapsed
        finally:
            await conn.close()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


def _create_store(db: str) -> None:
    """Create and migrate the store at ``db`` and pin the scope (untimed set-up)."""
    import anyio

    from runner.io.stores import open_store
    from runner.leads.models import validate_scope

    async def create() -> None:
        async with await open_store(db, scope=validate_scope(dict(SCOPE))):
            pass

    anyio.run(create)


#: the CLI children's environment (``compiled_env``), set by ``measure`` for its run
_CHILD_ENV: dict[str, dict[str, str]] = {}


def _warm_children(directory: Path) -> None:
    """Compile what an ``accept --records`` child imports, on both stores, into the
    children's bytecode cache (untimed), as installing the package would have."""
    (directory / "sqlite").mkdir(mode=0o700)
    _runner(directory / "sqlite", str(directory / "sqlite" / "warm.db"), _lines(1, 0))
    (directory / "postgres").mkdir(mode=0o700)
    _runner_pg(directory / "postgres", _lines(1, 0), child=True)


def _runner(directory: Path, db: str, lines: list[bytes], *, new_store: bool = False
            ) -> float:
    """``runner accept --records -`` as a child, timed from spawn to exit; the store is
    created beforehand (untimed) unless ``new_store``."""
    scope = directory / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    if not new_store:
        _create_store(db)
    wall, _, stdout, _ = run_child(["accept", "--db", db, "--scope", str(scope),
                                    "--records", "-"], stdin=b"\n".join(lines) + b"\n",
                                   env=_CHILD_ENV.get("env"))
    answers = stdout.count(b"\n")
    if answers != len(lines) or stdout.count(b'"accepted"') != len(lines):
        raise RuntimeError(f"runner answered {answers} of {len(lines)}")
    return len(lines) / wall


def _runner_in_process(directory: Path, db: str, lines: list[bytes]) -> float:
    """The bulk-accept path of ``accept --records FILE`` (on PostgreSQL with the second
    session the command opens beside the first groups' work), timed from the first read to
    the last answer (store created and migrated beforehand, untimed)."""
    import anyio

    from runner.clock import SystemClock
    from runner.commands.bulk import accept_records
    from runner.io.stores import open_store
    from runner.leads.intake import Intake
    from runner.leads.models import validate_scope
    from runner.store import Store
    from runner.storedata import is_postgres

    events = directory / "events.ndjson"
    events.write_bytes(b"\n".join(lines) + b"\n")
    answers = directory / "answers.ndjson"
    args = argparse.Namespace(log_format="text")

    async def run() -> float:
        scope = validate_scope(dict(SCOPE))
        async with (await open_store(db, scope=scope) as store,
                    contextlib.AsyncExitStack() as lanes):

            async def open_lane() -> Store:  # as the command opens its second session
                return await lanes.enter_async_context(
                    await open_store(db, scope=scope, create=False))

            fd = os.open(events, os.O_RDONLY)
            try:
                with (open(answers, "w", encoding="utf-8") as out,  # noqa: ASYNC230
                      contextlib.redirect_stdout(out)):
                    started = time.perf_counter()
                    code = await accept_records(args, Intake(store, SystemClock(), scope), fd,
                                                open_lane if is_postgres(db) else None)
                    out.flush()
                    elapsed = time.perf_counter() - started
            finally:
                os.close(fd)
        if code != 0:
            raise RuntimeError(f"runner rejected records (exit {code})")
        return elapsed

    elapsed = anyio.run(run)
    data = answers.read_bytes()
    answered = data.count(b"\n")
    if answered != len(lines) or data.count(b'"accepted"') != len(lines):
        raise RuntimeError(f"runner answered {answered} of {len(lines)}")
    return len(lines) / elapsed


def _drop_pg(schema: str) -> None:
    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()

    asyncio.run(drop())


def _runner_pg(directory: Path, lines: list[bytes], *, child: bool = False,
               new_store: bool = False) -> float:
    schema = "bench_runner_" + uuid.uuid4().hex[:8]
    dsn = f"{PG_DSN}?schema={schema}"
    try:
        if child:
            return _runner(directory, dsn, lines, new_store=new_store)
        return _runner_in_process(directory, dsn, lines)
    finally:
        _drop_pg(schema)


async def _pg_statement(lines: list[bytes]) -> dict[str, Any]:
    """Where runner's bulk insert spends the server's time: ``EXPLAIN ANALYZE`` of the
    statement ``accept --records`` runs per group (``_insert_leads``) on a new store,
    1,000 rows at a time, split into each trigger's time and the rest (the lead rows with
    their indexes).  The triggers are the schema's (the accepted outbox event and the
    kept counts); reported, not changed, here."""
    import re

    import asyncpg

    from runner.io.postgres.base import NUMBERED
    from runner.io.postgres.schema import render

    schema = "bench_stmt_" + uuid.uuid4().hex[:8]
    await asyncio.to_thread(_create_store, f"{PG_DSN}?schema={schema}")
    conn = await asyncpg.connect(PG_DSN, server_settings=DURABLE)
    try:
        sql, params = NUMBERED["_insert_leads"]
        assert params == ("at", "tenant_ids", "source_lead_ids", "canonicals", "write_ids")
        explain = "EXPLAIN (ANALYZE, SUMMARY) " + render(sql, f'"{schema}"')
        total, triggers = 0.0, dict[str, float]()
        for start in range(0, len(lines), PER_TXN):
            rows = _prepare_rows(lines[start:start + PER_TXN])
            columns = [list(c) for c in zip(*rows, strict=True)]
            plan = "\n".join(r[0] for r in await conn.fetch(
                explain, "2026-12-02T00:00:00.000000Z", *columns))
            found = re.search(r"Execution Time: ([\d.]+)", plan)
            assert found is not None, plan
            total += float(found.group(1))
            for name, ms in re.findall(r"Trigger (\w+): time=([\d.]+)", plan):
                triggers[name] = triggers.get(name, 0.0) + float(ms)
        shares = {f"trigger {name}": ms / total for name, ms in sorted(triggers.items())}
        shares["the lead rows and their indexes"] = 1 - sum(shares.values())
        return {"rows": len(lines), "execution_us_per_row": 1000 * total / len(lines),
                "shares": shares}
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


def _have_pgqueuer() -> bool:
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def _check_durable() -> None:
    """runner's sessions take the server's ``synchronous_commit``: it must be ``on``, as
    the floor's and PgQueuer's sessions set it, or the sides would not be alike."""
    async def show() -> str:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        try:
            return str(await conn.fetchval("SHOW synchronous_commit"))
        finally:
            await conn.close()

    found = asyncio.run(show())
    if found != DURABLE["synchronous_commit"]:
        raise RuntimeError(f"the server's synchronous_commit is {found!r}, not 'on': "
                           "runner's commits would not be as durable as the others'")


def measure(n: int, rounds: int) -> dict[str, Any]:
    _check_durable()
    with tempfile.TemporaryDirectory() as tmp:
        _CHILD_ENV["env"] = compiled_env(Path(tmp) / "pycache")
        try:
            _warm_children(Path(tmp))
            return _measure(n, rounds)
        finally:
            _CHILD_ENV.clear()


def _measure(n: int, rounds: int) -> dict[str, Any]:
    contenders: dict[str, Callable[[Path, int], float]] = {
        "stdlib floor": lambda d, k: stdlib_floor(d, _lines(k, 0)),
        "runner SQLite": lambda d, k: _runner_in_process(d, str(d / "runner.db"),
                                                          _lines(k, 0)),
        "runner SQLite (CLI child)": lambda d, k: _runner(d, str(d / "runner.db"),
                                                          _lines(k, 0)),
        "PostgreSQL floor": lambda d, k: asyncio.run(_pg_floor(_lines(k, 0))),
        "runner PostgreSQL": lambda d, k: _runner_pg(d, _lines(k, 0)),
        "runner PostgreSQL (CLI child)": lambda d, k: _runner_pg(d, _lines(k, 0), child=True),
        "runner PostgreSQL (CLI child, new store)": lambda d, k: _runner_pg(
            d, _lines(k, 0), child=True, new_store=True),
    }
    skipped = []
    if _have_pgqueuer():
        contenders["PgQueuer"] = lambda d, k: asyncio.run(_pgqueuer(_lines(k, 0)))
    else:
        skipped.append("PgQueuer: not installed (pip install -e '.[bench]')")
    return compare(contenders, n, rounds, {
        "runner SQLite / stdlib floor": ("runner SQLite", "stdlib floor", 0.95),
        "runner SQLite / PgQueuer": ("runner SQLite", "PgQueuer", 1.1),
        "runner PostgreSQL / PgQueuer": ("runner PostgreSQL", "PgQueuer", 1.0),
        "runner PostgreSQL / PostgreSQL floor": ("runner PostgreSQL", "PostgreSQL floor",
                                                 None),
        "runner SQLite (CLI child) / stdlib floor": ("runner SQLite (CLI child)",
                                                     "stdlib floor", None),
        # issue 32.3: whole process (start-up included) against the peer and the floor
        # from their first insert, and against runner's own SQLite intake
        "runner PostgreSQL (CLI child) / PgQueuer": ("runner PostgreSQL (CLI child)",
                                                     "PgQueuer", 1.1),
        "runner PostgreSQL (CLI child) / PostgreSQL floor": (
            "runner PostgreSQL (CLI child)", "PostgreSQL floor", 0.95),
        "runner PostgreSQL (CLI child) / runner SQLite (CLI child)": (
            "runner PostgreSQL (CLI child)", "runner SQLite (CLI child)", 0.8),
        "runner PostgreSQL / runner SQLite": ("runner PostgreSQL", "runner SQLite", None),
        "runner PostgreSQL (CLI child, new store) / PgQueuer": (
            "runner PostgreSQL (CLI child, new store)", "PgQueuer", None),
    }, skipped) | {"pg_statement": asyncio.run(_pg_statement(_lines(min(n, 20_000), 0)))}


def main(argv: list[str] | None = None) -> int:
    return comparison_main(argv, "ingest", "bulk accept", __doc__.splitlines()[0],
                           ((10_000, 1), (100_000, 3)), measure)


if __name__ == "__main__":
    sys.exit(main())
