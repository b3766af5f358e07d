"""Every transaction runner holds on PostgreSQL is bounded (issue 30 point 3): a worker
stopped (SIGSTOP) inside its poll pass's transaction held row locks that blocked every
``accept`` until accept's own 60 s statement timeout (exit 74).  Each session now sets
``idle_in_transaction_session_timeout``: the server ends the stopped worker's session
after that bound, accept goes on, and the worker, continued (SIGCONT), meets one
classified line (exit 74), its pass rolled back."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from runner.io.postgres import connection
from runner.io.stores import open_store
from tests import pg
from tests.helpers import ROOT, CliStore, event, run_main, status_records, write_json
from tests.pgcluster import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def store(workdir: Path, scope_file: Path) -> Iterator[CliStore]:
    pg.require()
    schema = pg.new_schema()
    made = CliStore(workdir, scope_file, pg.location(schema))
    made.confirmed(3)
    yield made
    pg.drop_later([schema])


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0]


def _idle_in_transaction(pid: int) -> list[tuple[object, ...]]:
    return pg.fetch("SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' "
                    "AND application_name LIKE $1", f"runner pid={pid} %")


@pytest.mark.parametrize("bound", [
    "1s",  # the DSN's own bound (a parameter of that name wins): the mechanism, fast
    # runner's default (10 s): before it, accept waited for its 60 s statement timeout
    pytest.param(None, marks=pytest.mark.slow),
])
def test_a_worker_stopped_inside_its_poll_pass_blocks_accept_only_for_the_bound(
        store: CliStore, bound: str | None) -> None:
    assert store.cli("poll-status")["polled"] == 3  # first observations
    target = sqlite3.connect(store.target)
    target.execute("UPDATE sheet SET status = 'won'")  # the next pass writes events
    target.commit()
    target.close()
    bounded = store.db if bound is None else \
        f"{store.db}&{urlencode({connection.IDLE_SETTING: bound})}"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.procs.pg_stopped_poll", "poll-status", "--db", bounded,
         "--scope", str(store.scope), "--target", str(store.target)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        wait_until(lambda: _state(child.pid) == "T", 10, "the worker to stop")
        # accept needs a row the stopped pass locked: it waits for the server to end the
        # stopped session, then commits (before the bound: until accept's own 60 s
        # statement timeout, then exit 74; run_main's 30 s would fail here)
        accepted = run_main("accept", "--db", store.db, "--scope", store.scope, "--record",
                            write_json(store.dir / "e9.json", event(9)), timeout=30)
        assert accepted.returncode == 0, accepted.stderr
        assert '"result":"accepted"' in accepted.stdout
        assert not _idle_in_transaction(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(timeout=10)
    assert child.returncode == 74, err
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("runner: error: PostgreSQL at "), err
    assert ("ended runner's session, idle inside a transaction for longer than "
            "idle_in_transaction_session_timeout (was this process stopped?)") in err, err
    # the pass was rolled back: no snapshot moved, and the next pass writes them
    assert {r["snapshot"]["status"] for r in status_records(store.db)
            if r["source_lead_id"] != "lead-9"} == {"new"}
    assert store.cli("poll-status")["changed"] == 3


async def test_every_session_bounds_its_idle_transactions() -> None:
    pg.require()
    schema = pg.new_schema()
    db = pg.location(schema)
    pg.drop_later([schema])
    async with await open_store(db, create=True) as opened:
        conn = opened._conn  # type: ignore[attr-defined]
        show = f"SHOW {connection.IDLE_SETTING}"
        assert await conn.fetchval(show) == connection.IDLE_IN_TRANSACTION_TIMEOUT
        async with opened.reading():  # a read snapshot holds no row lock: longer
            assert await conn.fetchval(show) == connection.READ_IDLE_TIMEOUT
        assert await conn.fetchval(show) == connection.IDLE_IN_TRANSACTION_TIMEOUT
        lock = opened.worker_lock()
        async with lock:
            assert await lock._conn.fetchval(show) == connection.IDLE_IN_TRANSACTION_TIMEOUT
    given = f"{db}&{urlencode({connection.IDLE_SETTING: '3s'})}"
    async with await open_store(given, create=False) as opened:
        conn = opened._conn  # type: ignore[attr-defined]
        assert await conn.fetchval(show) == "3s"
        async with opened.reading():  # the DSN's own bound is kept for reads too
            assert await conn.fetchval(show) == "3s"
