"""PostgreSQL specifics (issue 6): the advisory worker lock with real processes, errors at
the edge, concurrency while a worker runs, migrations, the DSN.

Everything else runs on PostgreSQL through the backend-parametrized suite.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.io.postgres import dsn as pg_dsn
from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import (
    ROOT,
    Child,
    CliStore,
    event,
    last_json,
    run_main,
    wait_path,
    write_json,
)


@pytest.fixture
def db() -> Iterator[str]:
    """A fresh PostgreSQL store location (an isolated schema, dropped at the end)."""
    pg.require()
    schema = pg.new_schema()
    yield pg.location(schema)
    pg.drop_later([schema])


class Worker(Child):
    """A real ``once --fault hang`` process, stuck in its first target write."""

    def __init__(self, db: str, workdir: Path, scope: Path, target: Path, *extra: str) -> None:
        self.hang = workdir / f"hang-{time.monotonic_ns()}"
        self.hang.mkdir()
        super().__init__("once", "--db", db, "--scope", scope, "--target", target,
                         "--fault", "hang", *extra, env={"RUNNER_HANG_DIR": str(self.hang)})
        wait_path(self.hang / "entered-write", self)

    def release(self) -> tuple[int, str, str]:
        (self.hang / "release").touch()
        code = self.finish(timeout=60)
        return code, "\n".join(self.out), "\n".join(self.err)


class Env(CliStore):
    def hanging_worker(self, *extra: str) -> Worker:
        return Worker(self.db, self.dir, self.scope, self.target, *extra)


@pytest.fixture
def env(db: str, workdir: Path, scope_file: Path) -> Env:
    return Env(workdir, scope_file, db)


def one_clean_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stdout == ""
    return lines[0]


# -- the worker lock (point 3) ---------------------------------------------------------


def test_sigkill_of_the_holder_frees_the_lock_and_its_send_becomes_uncertain(env: Env) -> None:
    env.accept(1, 2)
    worker = env.hanging_worker("--batch-size", "1")  # lead-2 is not in lead-1's request
    assert env.once().returncode == 75  # held while the holder lives
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.kill()
    # the server ends the dead client's session, and its lock with it
    deadline = time.monotonic() + 15
    while (fresh := env.once()).returncode == 75:
        assert time.monotonic() < deadline, "the lock outlived its holder"
        time.sleep(0.1)
    assert fresh.returncode == 0, fresh.stderr
    summary = last_json(fresh.stdout)
    # lead-1 was in flight (its row written, the answer never came): made uncertain, then
    # confirmed by readback, never resent; lead-2 was never marked, so this worker sends it
    assert (summary["recovered"], summary["reconciled"]) == (1, 1)
    assert (summary["dispatched"], summary["confirmed"]) == (1, 1)
    recs = env.records()
    assert (recs["lead-1"]["state"], recs["lead-1"]["attempts"]) == ("confirmed", 1)
    assert recs["lead-2"]["state"] == "confirmed"
    assert [r[4] for r in sheet_rows(env.target)] == ["lead-1", "lead-2"]
    moves = [json.loads(p)["to"] for (p,) in pg.fetch(
        f'SELECT payload::text FROM "{pg.schema_of(env.db)}".outbox '
        "WHERE subject = 'lead-1' AND kind = 'state_changed' ORDER BY seq")]
    assert moves == ["in_flight", "uncertain", "confirmed"]


def test_the_lock_names_its_holder_and_ignores_how_the_dsn_is_spelled(env: Env) -> None:
    env.accept(1)
    worker = env.hanging_worker()
    try:
        other_spelling = env.db.replace("postgresql://", "postgres://", 1)
        proc = run_main("once", "--db", other_spelling, "--scope", env.scope,
                       "--target", env.dir / "other-target.db")
        assert proc.returncode == 75, proc.stderr
        line = one_clean_line(proc)
        assert f"pid {worker.proc.pid} on " in line and "holds the lock" in line
        names = [n for (n,) in pg.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE pid = ANY($1::int[])",
            pg.backend_pids(worker.proc.pid))]
        assert names and all(n.startswith(f"runner pid={worker.proc.pid} host=") for n in names)
    finally:
        code, out, err = worker.release()
    assert code == 0, err
    assert last_json(out)["confirmed"] == 1


async def test_sessions_ask_for_keepalives_and_no_idle_timeout(db: str) -> None:
    from runner.io.stores import open_store

    async with await open_store(db, create=True) as store:
        conn = store._conn  # type: ignore[attr-defined]
        assert await conn.fetchval("SHOW tcp_keepalives_idle") == "10"
        assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"
        assert await conn.fetchval("SHOW idle_session_timeout") == "0"
        assert (await conn.fetchval("SHOW application_name")).startswith("runner pid=")


# -- a dropped connection mid-cycle (point 5) --------------------------------------------


def test_dropped_connection_during_a_send_is_never_resent(env: Env) -> None:
    env.accept(1)
    worker = env.hanging_worker()
    pids = pg.backend_pids(worker.proc.pid)
    # the store's session, the lock's, and the dispatch run's own (its steps' outcomes,
    # runner.io.postgres.delivery)
    assert len(pids) == 3
    pg.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", pids)
    code, out, err = worker.release()  # the write lands; recording it cannot
    assert code == 74, err
    assert out == "" and "Traceback" not in err
    assert "lost the connection to PostgreSQL" in err.strip().splitlines()[-1]
    assert env.records()["lead-1"]["state"] == "in_flight"  # nothing half-written
    fresh = env.once()
    assert fresh.returncode == 0, fresh.stderr
    summary = last_json(fresh.stdout)
    assert (summary["recovered"], summary["reconciled"], summary["dispatched"]) == (1, 1, 0)
    rec = env.records()["lead-1"]
    assert (rec["state"], rec["attempts"]) == ("confirmed", 1)
    assert len(sheet_rows(env.target)) == 1


def test_a_worker_whose_lock_session_ends_starts_no_new_send(env: Env) -> None:
    env.accept(1, 2)
    worker = env.hanging_worker("--batch-size", "1")
    lock_session = pg.fetch(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.pid = ANY($1::int[])", pg.backend_pids(worker.proc.pid))
    assert len(lock_session) == 1
    pg.execute("SELECT pg_terminate_backend($1)", lock_session[0][0])
    code, _out, err = worker.release()  # lead-1 finishes; lead-2 must not start
    assert code == 74, err
    assert "lock" in err.strip().splitlines()[-1] and "Traceback" not in err
    recs = env.records()
    assert recs["lead-1"]["state"] == "confirmed"
    assert (recs["lead-2"]["state"], recs["lead-2"]["attempts"]) == ("prepared", 0)
    fresh = env.once()
    assert last_json(fresh.stdout)["confirmed"] == 1
    assert [r[4] for r in sheet_rows(env.target)] == ["lead-1", "lead-2"]


def test_a_worker_whose_lock_session_ends_marks_no_new_batch(env: Env) -> None:
    """The batch's in-flight mark is fenced like the single one (issue 16)."""
    env.accept(1, 2, 3, 4)
    worker = env.hanging_worker("--batch-size", "2")
    lock_session = pg.fetch(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.pid = ANY($1::int[])", pg.backend_pids(worker.proc.pid))
    pg.execute("SELECT pg_terminate_backend($1)", lock_session[0][0])
    code, _out, err = worker.release()  # the first batch finishes; the second must not
    assert code == 74, err
    assert "lock" in err.strip().splitlines()[-1] and "Traceback" not in err
    recs = env.records()
    assert [recs[f"lead-{i}"]["state"] for i in (1, 2)] == ["confirmed"] * 2
    assert [(recs[f"lead-{i}"]["state"], recs[f"lead-{i}"]["attempts"])
            for i in (3, 4)] == [("prepared", 0)] * 2
    assert last_json(env.once("--batch-size", "2").stdout)["confirmed"] == 2
    assert [r[4] for r in sheet_rows(env.target)] == [f"lead-{i}" for i in (1, 2, 3, 4)]


# -- errors at the edge (point 5) ------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_one_line_exit_74(workdir: Path, scope_file: Path) -> None:
    pg.require()
    db = f"postgresql://root@127.0.0.1:{closed_port()}/test?schema=nothing"
    rec = write_json(workdir / "e.json", event(1))
    for argv in (("accept", "--db", db, "--scope", scope_file, "--record", rec),
                 ("status", "--db", db),
                 ("once", "--db", db, "--scope", scope_file, "--target", workdir / "t.db")):
        proc = run_main(*argv)
        assert proc.returncode == 74, proc.stderr
        assert "connection refused" in one_clean_line(proc)


def _with_user(user: str, database: str = "test") -> str:
    parts = pg_dsn.urlsplit(pg.dsn())
    netloc = f"{user}@{parts.hostname}:{parts.port or 5432}"
    return pg.location(pg.new_schema(), pg_dsn.urlunsplit(
        parts._replace(netloc=netloc, path=f"/{database}")))


def test_authentication_failure_is_one_line_exit_77(workdir: Path, scope_file: Path) -> None:
    pg.require()
    db = _with_user("runner_no_such_role")
    rec = write_json(workdir / "e.json", event(1))
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
    assert proc.returncode == 77, proc.stderr
    line = one_clean_line(proc)
    assert "refused access" in line and "runner_no_such_role" in line
    assert run_main("status", "--db", db).returncode == 77


def test_missing_privilege_is_exit_77_until_a_dba_makes_the_schema(
    workdir: Path, scope_file: Path
) -> None:
    pg.require()
    if not pg.fetch("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
                    )[0][0]:
        pytest.skip("the test role may not create roles")
    role = f"runner_test_limited_{os.getpid()}"  # roles are per cluster: one per run
    pg.execute(f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN")
    db = _with_user(role)
    try:
        rec = write_json(workdir / "e.json", event(1))
        proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
        assert proc.returncode == 77, proc.stderr
        assert "permission denied" in one_clean_line(proc)
        assert not pg.exists(db)
        # a role that may not create schemas can use one a DBA made for it
        pg.execute(f'CREATE SCHEMA "{pg.schema_of(db)}" AUTHORIZATION {role}')
        proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
        assert proc.returncode == 0, proc.stderr
    finally:
        pg.drop_schemas([pg.schema_of(db)])
        pg.execute(f"DROP ROLE IF EXISTS {role}")


def test_unknown_database_is_one_line_exit_66(workdir: Path, scope_file: Path) -> None:
    pg.require()
    user = pg_dsn.urlsplit(pg.dsn()).username or "root"
    db = _with_user(user, database="runner_no_such_database")
    rec = write_json(workdir / "e.json", event(1))
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
    assert proc.returncode == 66, proc.stderr
    line = one_clean_line(proc)
    assert "runner_no_such_database" in line and "does not exist" in line


def test_bad_schema_name_is_a_usage_error(scope_file: Path, workdir: Path) -> None:
    rec = write_json(workdir / "e.json", event(1))
    db = pg.location("Bad-Name")
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
    assert proc.returncode == 2 and "schema" in one_clean_line(proc)


def test_missing_driver_is_one_line_and_sqlite_never_loads_it(workdir: Path) -> None:
    no_driver = (
        "import sys; sys.modules['asyncpg'] = None\n"
        "from runner.cli import main\n"
        "sys.exit(main(['status', '--db', 'postgresql://127.0.0.1/test']))\n")
    proc = subprocess.run([sys.executable, "-c", no_driver], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 74
    assert "pip install 'runner[postgres]'" in one_clean_line(proc)
    sqlite_only = (
        "import sys\n"
        "from runner.cli import main\n"
        f"code = main(['status', '--db', {str(workdir / 'none.db')!r}])\n"
        "assert 'asyncpg' not in sys.modules, 'asyncpg was imported'\n"
        "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", sqlite_only], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 66, proc.stderr


def test_dsn_parsing() -> None:
    loc = pg_dsn.parse("postgresql://u:secret@db.example:6543/leads?sslmode=disable&schema=eu")
    assert (loc.schema, loc.where) == ("eu", "db.example:6543/leads")
    assert loc.dsn == "postgresql://u:secret@db.example:6543/leads?sslmode=disable"
    assert pg_dsn.parse("postgres://h/db").schema == "runner"
    assert "secret" not in pg_dsn.describe("postgresql://u:secret@h/db")


# -- concurrency (point 4) -------------------------------------------------------------


def test_status_works_while_a_worker_and_four_writers_run(env: Env) -> None:
    env.accept(0)
    worker = env.hanging_worker()
    go = env.dir / "go"
    writers = [subprocess.Popen(
        [sys.executable, "-m", "tests.procs.accept_many", env.db,
         str(1 + k * 60), str(1 + (k + 1) * 60), str(go)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(4)]
    try:
        go.touch()
        seen = []
        while any(w.poll() is None for w in writers) or not seen:
            proc = run_main("status", "--db", env.db)
            assert proc.returncode == 0, proc.stderr
            doc = json.loads(proc.stdout)
            assert doc["counts"]["in_flight"] == 1  # the worker is still in its send
            seen.append(sum(doc["counts"].values()))
        for w in writers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0, err
            assert json.loads(out) == {"accepted": 60}
    finally:
        code, out, err = worker.release()
    assert code == 0, err
    assert seen == sorted(seen)  # every read was a consistent snapshot, never going back
    recs = env.records()
    assert len(recs) == 241
    assert recs["lead-0"]["state"] == "confirmed"


# -- migrations (point 1) --------------------------------------------------------------


def test_a_v1_store_is_upgraded_in_place(db: str, workdir: Path, scope_file: Path) -> None:
    """A store at schema v1 (built from the v1 migration alone) is upgraded on open by a
    writing command, keeps its records and goes on working; status does not migrate."""
    from runner.io.postgres import schema

    s = f'"{pg.schema_of(db)}"'
    scope_json = json.dumps(json.loads(scope_file.read_text()))
    pg.execute(
        "BEGIN;"
        + schema.render(schema.CREATE_SCHEMA + schema.BOOTSTRAP + schema.MIGRATIONS[1], s)
        + f"INSERT INTO {s}.schema_migrations (version) VALUES (1);"
        + f"INSERT INTO {s}.meta VALUES ('scope', '{scope_json}');"
        + f"INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id, accepted_at,"
        + f" updated_at) VALUES ('tenant-synthetic-1', 'lead-1', '{json.dumps(event(1))}',"
        + " 'w-1', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z'); COMMIT;")
    status = run_main("status", "--db", db)
    assert status.returncode == 78 and "older" in status.stderr
    rec = write_json(workdir / "e.json", event(2))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    versions = [v for (v,) in pg.fetch(f"SELECT version FROM {s}.schema_migrations ORDER BY 1")]
    assert versions == list(range(1, schema.LATEST + 1))
    once = run_main("once", "--db", db, "--scope", scope_file, "--target", workdir / "t.db")
    assert once.returncode == 0, once.stderr
    assert last_json(once.stdout)["confirmed"] == 2
