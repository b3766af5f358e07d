"""A PostgreSQL server that goes away under a one-shot command (issue 30 point 3): the
command exits with a classified code and one clear line (``StoreUnreachable``,
``ConnectionLost``: exit 74, with their reason in ``--log-format json``), never
"internal error", and what it had answered stays committed.

A private cluster (tests/pgcluster.py) is killed with SIGKILL during a real command: the
shared server is never touched."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Child, event, run_main, status_records
from tests.pgcluster import Cluster, private_cluster, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with private_cluster() as made:
        yield made


def one_error(lines: list[str]) -> dict[str, object]:
    """The only line on stderr, as JSON (``--log-format json``): no traceback."""
    errors = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(lines) == len(errors) and errors, lines
    last = errors[-1]
    assert last["level"] == "error" and "internal" not in str(last["message"]), last
    return last


@pytest.mark.slow  # the default run's representative: tests/test_pgpair.py
def test_a_server_killed_under_a_bulk_accept_is_one_line_and_loses_no_answer(
        cluster: Cluster, workdir: Path, scope_file: Path) -> None:
    db = cluster.dsn("postgres", schema="lost")
    child = Child("accept", "--db", db, "--scope", scope_file, "--records", "-",
                  "--log-format", "json", stdin=True)
    try:
        child.send(json.dumps(event(1)) + "\n")
        child.wait_out_lines(1)  # answered: committed
        cluster.kill9()
        child.send(json.dumps(event(2)) + "\n")
        child.close_stdin()
        code = child.finish()
    finally:
        child.kill()
    assert code == 74
    assert [json.loads(line)["result"] for line in child.out] == ["accepted"]
    error = one_error([line for line in child.err if '"level":"error"' in line])
    assert error["reason"] == "connection_lost", error
    assert f"lost the connection to PostgreSQL at 127.0.0.1:{cluster.port}/postgres" in \
        str(error["message"])
    # down: one line saying so, exit 74
    down = run_main("status", "--db", db, "--log-format", "json")
    assert down.returncode == 74
    refused = one_error(down.stderr.splitlines())
    assert refused["reason"] == "store_unreachable"
    assert str(refused["message"]).endswith("connection refused")
    cluster.start()
    assert [r["source_lead_id"] for r in status_records(db)] == ["lead-1"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["once", "accept", "status"])
def test_a_server_killed_at_a_random_moment_of_a_command_is_one_classified_line(
        cluster: Cluster, workdir: Path, scope_file: Path, command: str) -> None:
    """Six kills, each after a random number of the command's own output lines (a
    batch sent, an answer given, a record listed) over 3,000 records: each run ends 0
    (it finished first) or 74 with one line and a classified reason."""
    records = workdir / "records.ndjson"
    records.write_text("".join(json.dumps(event(i)) + "\n" for i in range(3000)))
    seen: dict[str, int] = {}
    rng = random.Random(30)
    for run in range(6):  # (the CI budget)
        if not cluster.is_running():
            cluster.start()
        db = cluster.dsn("postgres", schema=f"lost{run}")
        if command != "accept":  # arranged; a server just started may still be recovering
            wait_until(lambda db=db: run_main("accept", "--db", db, "--scope", scope_file,
                                        "--records", records).returncode == 0, 60,
                       "the arranged accept to succeed on the restarted server")
        # a target of each run's own: a target keeps the marks of one store (SPEC E8)
        target = workdir / f"target-{run}.db"
        argv, lines = {
            "once": (["--scope", scope_file, "--target", target, "--batch-size", "10"], 300),
            "accept": (["--scope", scope_file, "--records", records], 3000),
            "status": (["--records"], 3000)}[command]
        moment = rng.randint(1, lines)
        child = Child(command, "--db", db, *argv, "--log-format", "json")
        try:
            child.wait_for(lambda c, k=moment: len(c.out) + len(c.err) >= k
                           or c.proc.poll() is not None, 60, "the command's progress")
            cluster.kill9()
            code = child.finish(60)
        finally:
            child.kill()
        if code == 0:
            seen["finished first"] = seen.get("finished first", 0) + 1
            continue
        assert code == 74, child.err[-3:]
        error = one_error([line for line in child.err if '"level":"error"' in line])
        reason = str(error["reason"])
        assert reason in ("connection_lost", "store_unreachable", "lock_lost"), error
        seen[reason] = seen.get(reason, 0) + 1
    assert sum(seen.values()) == 6
    assert seen.get("finished first", 0) < 6  # the kills did land inside the commands
