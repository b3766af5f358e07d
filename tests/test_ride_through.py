"""``start`` rides through a lost store (issue 30 point 3), with real processes on the
shared server, which is never stopped: a store lost as a restart loses it is provoked by
ending the worker's sessions (``pg_terminate_backend``) or by cutting the network path
to the server (``tests/pgproxy.py``: every connection closed, every new one refused until
it is restored).  Nothing is sent twice, nothing is lost, a second worker that took the
lock meanwhile keeps it (the first steps aside, exit 75), a store that stays away ends
the run with one line (exit 74), a signal during the reconnect stops it at once (exit
0), and ``/readyz`` says not ready meanwhile.  The same with a killed and restarted
server, and the pipeline workers and the sweep, are in tests/test_failover.py (slow)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import Child, CliStore, wait_path
from tests.httpkit import port_of, wait_ready
from tests.pgproxy import PgProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(pg_db: str, workdir: Path, scope_file: Path) -> CliStore:
    return CliStore(workdir, scope_file, pg_db)


@pytest.fixture
def proxy() -> Iterator[PgProxy]:
    pg.require()
    server = urlsplit(pg.dsn())
    with PgProxy(server.port or 5432, upstream_host=server.hostname or "127.0.0.1") as made:
        yield made


def through(proxy: PgProxy, pg_db: str) -> str:
    """``pg_db`` reached through the proxy."""
    server = urlsplit(pg.dsn())
    return (f"{proxy.dsn(server.username or 'postgres', server.path.lstrip('/'))}"
            f"&schema={pg.schema_of(pg_db)}")


def start(store: CliStore, pg_db: str, *extra: str, **kw: object) -> Child:
    return Child("start", "--db", pg_db, "--scope", store.scope, "--target", store.target,
                 "--interval", "0.1", *extra, **kw)  # type: ignore[arg-type]


def summaries(child: Child) -> list[dict[str, int]]:
    return [json.loads(line) for line in child.out]


def delivered(child: Child) -> int:
    """Records a run confirmed, by a send or by a readback."""
    return sum(s["confirmed"] + s["reconciled"] for s in summaries(child))


def actions(child: Child, action: str, task: str = "start") -> list[str]:
    """The lines of ``action`` for ``task`` (the lead loop's, by default: the sweep and
    the pipeline workers reconnect their own sessions, in series of their own)."""
    return [line for line in child.err
            if f" {action} " in f" {line} " and f"task={task}" in line]


def one_row_each(target: Path, n: int) -> None:
    keys = [row[4] for row in sheet_rows(target)]
    assert sorted(keys) == sorted(f"lead-{i}" for i in range(1, n + 1)), keys


def test_start_rides_through_its_sessions_ending_mid_send_and_sends_nothing_twice(
        env: CliStore, pg_db: str) -> None:
    env.accept(1, 2, 3)
    hang = env.dir / "hang"
    hang.mkdir()
    child = start(env, pg_db, "--batch-size", "2", "--fault", "hang",
                  env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-write", child)  # lead-1 and lead-2 are in flight
        backends = pg.backend_pids(child.proc.pid)
        assert len(backends) >= 2  # the store's session, the lock's (and the sweep's)
        pg.execute("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p", backends)
        (hang / "release").touch()  # the batch lands; its outcome cannot be recorded
        child.wait_for(lambda c: delivered(c) >= 3, what="every record confirmed")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    one_row_each(env.target, 3)
    assert {r["source_lead_id"]: (r["state"], r["attempts"]) for r in env.all_records()} == {
        "lead-1": ("confirmed", 1), "lead-2": ("confirmed", 1), "lead-3": ("confirmed", 1)}
    total = {k: sum(s[k] for s in summaries(child))
             for k in ("recovered", "reconciled", "dispatched", "confirmed")}
    # what was in flight was made uncertain and read back, never sent again
    assert total == {"recovered": 2, "reconciled": 2, "dispatched": 3, "confirmed": 1}
    assert len(actions(child, "store.lost")) == 1
    assert len(actions(child, "store.reconnected")) == 1
    assert not any("Traceback" in line for line in child.err)


def test_a_worker_whose_lock_was_taken_while_it_reconnected_steps_aside_with_75(
        env: CliStore, pg_db: str, proxy: PgProxy) -> None:
    first = start(env, through(proxy, pg_db))
    second = None
    try:
        first.wait_out_lines(1)  # it holds the lock and ran a cycle
        proxy.cut()  # the server ends its sessions, and its lock with them
        first.wait_err("store.lost")
        second = start(env, pg_db)  # a worker that reaches the server takes the lock
        second.wait_out_lines(1)
        proxy.restore()  # the first gets through again, and finds the lock taken
        assert first.finish() == 75, first.err
        last = first.err[-1]
        assert "holds the lock" in last and "stepping aside" in last
        assert f"pid {second.proc.pid}" in last and "Traceback" not in "\n".join(first.err)
        env.accept(1)
        second.wait_for(lambda c: delivered(c) >= 1, what="the second delivering")
        second.signal(signal.SIGTERM)
        assert second.finish() == 0, second.err
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert delivered(first) == 0  # never both delivering
    one_row_each(env.target, 1)


def test_a_store_that_stays_away_ends_start_with_74_and_one_line(
        env: CliStore, pg_db: str, proxy: PgProxy) -> None:
    child = start(env, through(proxy, pg_db), "--reconnect-max", "1")
    try:
        child.wait_out_lines(1)
        proxy.cut()
        assert child.finish() == 74, child.err
    finally:
        child.kill()
    errors = [line for line in child.err if line.startswith("runner: error")]
    assert len(errors) == 1 and child.err[-1] == errors[0]
    assert "stayed unreachable" in errors[0] and "--reconnect-max" in errors[0]
    assert not any("Traceback" in line for line in child.err)
    assert len(actions(child, "store.lost")) == 1


def test_while_it_reconnects_start_is_not_ready_and_a_sigterm_stops_it_with_0(
        env: CliStore, pg_db: str, proxy: PgProxy) -> None:
    secret = env.dir / "secret"
    secret.write_bytes(b"s" * 32)
    secret.chmod(0o600)
    child = start(env, through(proxy, pg_db), "--listen", "127.0.0.1:0",
                  "--webhook-secret-file", str(secret))
    try:
        base = f"http://127.0.0.1:{port_of(child)}"
        assert wait_ready(int(base.rsplit(":", 1)[1]), child)["reconnecting"] is False
        proxy.cut()
        child.wait_err("store.lost")
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 503
        doc = ready.json()
        doc.pop("replication")  # read with the probe: the store is away
        assert doc == {"ready": False, "mode": "start", "lock": False, "store": False,
                       "stopping": False, "reconnecting": True, "require_synchronous": False}
        alive = httpx.get(f"{base}/healthz", timeout=10)
        assert alive.status_code == 200 and alive.json()["reconnecting"] is True
        proxy.restore()
        child.wait_err("store.reconnected")
        assert wait_ready(int(base.rsplit(":", 1)[1]), child)["lock"] is True
        proxy.cut()  # lost again; this time a stop comes during the reconnect
        child.wait_for(lambda c: len(actions(c, "store.lost")) == 2, what="a second loss")
        child.signal(signal.SIGTERM)
        assert child.finish(timeout=15) == 0, child.err
    finally:
        child.kill()
    assert not any("Traceback" in line for line in child.err)
