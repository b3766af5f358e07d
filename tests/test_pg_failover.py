"""runner against a real primary/standby pair (issue 30 points 3 and 4; slow: each test
makes its own pair with ``pg_basebackup`` and most kill a primary).

* Every command that takes ``--db`` works through a multi-host DSN that names the
  standby first (``target_session_attrs=read-write`` skips it), before and after a
  failover: in process through ``main(argv)``, ``start`` and ``serve`` as real processes.
* A stopped primary (SIGSTOP: it accepts TCP connections and never answers) costs each
  connect one host's ``connect_timeout``, not the whole connect.
* What is durable: ``status``, ``/readyz`` and ``start``'s banner say synchronous or
  asynchronous, as a plain role sees it; under asynchronous replication ``start`` warns
  once; ``--require-synchronous-replication`` refuses events on the asynchronous pair
  (accept 78, the webhook 503) and takes them on the synchronous one.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.pgpair import Pair
from runner.cli import COMMANDS
from tests.helpers import Child, event, run_cli, run_main, status_records, write_json
from tests.httpkit import body_of, port_of, signed, wait_ready
from tests.pgcluster import private_pair
from tests.test_cli_processes import ACTS, EXIT, NOW
from tests.test_http_processes import secret_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PLAIN = "plain_runner"


def standby_first(pair: Pair, schema: str, user: str | None = None) -> str:
    """The pair's DSN with the standby's host first: only target_session_attrs keeps
    runner off it."""
    a, b = (node.address for node in pair.nodes.values())
    return (f"postgresql://{user or pair.superuser}@{b},{a}/postgres"
            f"?target_session_attrs=read-write&schema={schema}")


def every_command(db: str, workdir: Path, scope_file: Path, tag: str) -> list[str]:
    """Each command of ``tests/test_cli_processes.py``'s table once on ``db`` (``start``
    as a real process, the others in process); the commands run."""
    target = workdir / f"target-{tag}.db"
    values = {"scope": str(scope_file), "target": str(target),
              "record": str(write_json(workdir / f"e1-{tag}.json", event(1))),
              "new_record": str(write_json(workdir / f"e2-{tag}.json", event(2))),
              "snapshot": str(write_json(workdir / "won.json", {"status": "won"}))}
    for argv in (["accept", "--db", db, "--scope", scope_file, "--record", values["record"]],
                 ["once", "--db", db, "--scope", scope_file, "--target", target],
                 ["candidate", "add", "--db", db, "--id", "c1", f"--now={NOW}"]):
        arranged = run_main(*argv)
        assert arranged.returncode == 0, arranged.stderr
    ran = []
    for command, (line, _keys) in sorted(ACTS.items()):
        argv = [arg.format(db=db, **values) for arg in line.split()]
        proc = run_cli(*argv) if command == "start" else run_main(*argv)
        assert proc.returncode == EXIT.get(command, 0), (command, proc.stderr)
        assert "error" not in proc.stderr.lower() or command in EXIT, (command, proc.stderr)
        ran.append(command)
    return ran


def serve_once(db: str, workdir: Path, scope_file: Path, *extra: str) -> tuple[int, Any]:
    """A real ``serve`` process: one webhook POST's status, and /readyz's document."""
    secret, env = secret_env(workdir)
    child = Child("serve", "--db", db, "--scope", scope_file, "--listen", "127.0.0.1:0",
                  "--webhook-secret-file", secret, *extra, env=env)
    try:
        port = port_of(child)
        body = body_of(event(7))
        posted = httpx.post(f"http://127.0.0.1:{port}/webhook", content=body,
                            headers=signed(body), timeout=30)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    return posted.status_code, ready.json()


def test_every_command_that_takes_db_follows_the_primary(workdir: Path,
                                                         scope_file: Path) -> None:
    with private_pair(synchronous=True) as pair:
        before = every_command(standby_first(pair, "before"), workdir, scope_file, "before")
        assert set(before) | {"serve", "target-serve"} == set(COMMANDS)
        assert serve_once(standby_first(pair, "before"), workdir, scope_file)[0] == 200
        pair.failover()  # a promoted synchronous standby has every acknowledged event
        db = standby_first(pair, "before")
        assert {r["source_lead_id"] for r in status_records(db)} == {"lead-1", "lead-2",
                                                                      "lead-7"}
        every_command(standby_first(pair, "after"), workdir, scope_file, "after")
        assert serve_once(standby_first(pair, "after"), workdir, scope_file)[0] == 200


def test_a_stopped_primary_costs_one_hosts_connect_timeout(workdir: Path,
                                                           scope_file: Path) -> None:
    """SIGSTOP leaves the primary's port open (the kernel takes the connection) and no
    answer: asyncpg's own connect timeout covers the whole host list, so handing it the
    list would never reach the promoted standby; runner gives each host its own."""
    import asyncio

    import asyncpg

    with private_pair(synchronous=False) as pair:
        db = pair.dsn(schema="stopped", connect_timeout="2")
        accept = ["accept", "--db", db, "--scope", scope_file, "--record"]
        assert run_main(*accept, write_json(workdir / "e1.json", event(1))).returncode == 0
        pair.wait_replayed()
        primary, standby = pair.primary(), pair.standby()
        # the standby named alone: it reads, says it is a standby, and takes no write
        alone_b = standby.dsn("postgres", schema="stopped")
        doc = json.loads(run_main("status", "--db", alone_b).stdout)["replication"]
        assert doc["mode"] == "standby"
        refused = run_main("accept", "--db", alone_b, "--scope", scope_file, "--record",
                           workdir / "e1.json", "--log-format", "json")
        assert refused.returncode == 74
        assert json.loads(refused.stderr)["reason"] == "store_read_only", refused.stderr
        primary.pause()
        try:
            pair.promote(standby=standby)

            async def whole_list() -> None:  # what asyncpg alone does with the list
                conn = await asyncpg.connect(pair.dsn(), timeout=4)
                await conn.close()

            with pytest.raises(TimeoutError):
                asyncio.run(whole_list())
            proc = run_main(*accept, write_json(workdir / "e2.json", event(2)))
            assert proc.returncode == 0, proc.stderr
            assert [r["source_lead_id"] for r in status_records(db)] == ["lead-1", "lead-2"]
            alone = run_main("status", "--db", primary.dsn("postgres", schema="stopped",
                                                            connect_timeout="2"))
            assert alone.returncode == 74
            assert alone.stderr.strip().endswith("no answer in time"), alone.stderr
        finally:
            primary.resume()


@pytest.fixture(params=["synchronous", "asynchronous"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    with private_pair(synchronous=request.param == "synchronous") as made:
        made.primary().execute(f"CREATE ROLE {PLAIN} LOGIN; "
                               f"GRANT CREATE ON DATABASE postgres TO {PLAIN}")
        made.wait_replayed()
        yield made


def test_runner_says_what_is_durable_and_the_option_refuses_the_asynchronous_pair(
        pair: Pair, workdir: Path, scope_file: Path) -> None:
    sync = pair.synchronous
    mode = "synchronous" if sync else "asynchronous"
    db = standby_first(pair, "durable", user=PLAIN)  # a plain role: no pg_read_all_stats
    record = write_json(workdir / "e1.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record",
                    record).returncode == 0
    doc = json.loads(run_main("status", "--db", db).stdout)["replication"]
    assert (doc["mode"], doc["standbys"], doc["synchronous_standbys"]) == (
        mode, 1, 1 if sync else 0)
    # the option: accept
    strict = run_main("accept", "--db", db, "--scope", scope_file, "--record",
                      write_json(workdir / "e2.json", event(2)),
                      "--require-synchronous-replication")
    if sync:
        assert strict.returncode == 0, strict.stderr
    else:
        assert strict.returncode == 78 and strict.stderr.count("\n") == 1, strict.stderr
        assert "replication is not synchronous (asynchronous: asynchronous replication " \
               "to 1 standby" in strict.stderr
    # the option: the webhook of a real serve process, and its /readyz
    status, ready = serve_once(db, workdir, scope_file, "--require-synchronous-replication")
    assert status == (200 if sync else 503)
    assert ready["replication"]["mode"] == mode and ready["ready"] is sync
    # start --listen: the banner says it, an asynchronous pair is warned about once
    secret, env = secret_env(workdir)
    child = Child("start", "--db", db, "--scope", scope_file, "--target",
                  workdir / "target.db", "--interval", "0.2", "--listen", "127.0.0.1:0",
                  "--webhook-secret-file", secret, "--require-synchronous-replication",
                  env=env)
    try:
        port = port_of(child)
        if sync:
            wait_ready(port, child)
        body = body_of(event(9))
        posted = httpx.post(f"http://127.0.0.1:{port}/webhook", content=body,
                            headers=signed(body), timeout=30)
        assert posted.status_code == (200 if sync else 503)
        child.signal(signal.SIGTERM)
        assert child.finish(60) == 0, child.err
    finally:
        child.kill()
    banner = [line for line in child.err if "runner.started" in line]
    assert len(banner) == 1 and f"replication={mode}" in banner[0], child.err
    warned = [line for line in child.err if "replication.at_risk" in line]
    assert len(warned) == (0 if sync else 1), child.err
    if not sync:
        assert "an acknowledged event can be lost: asynchronous replication" in warned[0]
    kept = {r["source_lead_id"] for r in status_records(db)}
    assert kept == ({"lead-1", "lead-2", "lead-7", "lead-9"} if sync else {"lead-1"})
