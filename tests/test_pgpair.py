"""The primary/standby pair (issue 30 point 2), and the script users run it with
(``python -m harness.pgpair``): real servers, streaming replication, a real kill -9 and a
real promotion, and nothing left behind.

What the pair lets runner do is tested in tests/test_pg_failover.py (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness import pgpair
from tests.helpers import ROOT, Child, event, run_main, status_records, write_json
from tests.pgcluster import _alive, private_pair, require

pytestmark = pytest.mark.timeout(120)


def script(*args: str | Path, code: int = 0) -> Any:
    """``python -m harness.pgpair ARGS`` as a user runs it; its JSON line."""
    proc = subprocess.run([sys.executable, "-m", "harness.pgpair", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == code, proc.stderr
    if code:
        assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
        return proc.stderr
    return json.loads(proc.stdout)


def accept(dsn: str, workdir: Path, scope: Path, i: int) -> None:
    proc = run_main("accept", "--db", dsn, "--scope", scope, "--record",
                    write_json(workdir / f"e{i}.json", event(i)))
    assert proc.returncode == 0, proc.stderr


def test_the_multi_host_dsn_follows_a_failover_and_says_why_between(
        workdir: Path, scope_file: Path) -> None:
    """The fast representative: a real pair, a real kill -9 under a real command, and a
    promotion."""
    with private_pair(synchronous=False) as pair:
        db = pair.dsn(schema="pair")
        bulk = Child("accept", "--db", db, "--scope", scope_file, "--records", "-",
                     "--log-format", "json", stdin=True)
        try:
            bulk.send(json.dumps(event(1)) + "\n")
            bulk.wait_out_lines(1)  # answered: committed
            pair.wait_replayed()
            pair.kill_primary()
            bulk.send(json.dumps(event(9)) + "\n")
            bulk.close_stdin()
            assert bulk.finish() == 74
        finally:
            bulk.kill()
        # the session ended under the command: one line, classified, no traceback
        errors = [json.loads(line) for line in bulk.err if '"level":"error"' in line]
        assert len(errors) == 1 and errors[0]["reason"] == "connection_lost", bulk.err
        assert all(line.startswith("{") for line in bulk.err), bulk.err
        # the primary is gone and the standby not promoted yet: no host takes writes
        a, b = (node.address for node in pair.nodes.values())
        proc = run_main("accept", "--db", db, "--scope", scope_file, "--record",
                        write_json(workdir / "e2.json", event(2)))
        assert proc.returncode == 74 and proc.stderr.count("\n") == 1, proc.stderr
        assert (f"no host of PostgreSQL at {a},{b}/postgres gave a session for "
                f"target_session_attrs=read-write ({a}: connection refused; {b}: "
                "read-only); nothing was written") in proc.stderr
        # start, as a real process, fails fast at its own start-up (a wrong DSN must not
        # wait out --reconnect-max): 74 at once, the same one line, nothing delivered
        started = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "start", "--db", db, "--scope",
             str(scope_file), "--target", str(workdir / "t.db"), "--cycles", "1"],
            capture_output=True, text=True, timeout=60, check=False)
        assert started.returncode == 74, started.stderr
        assert "gave a session for target_session_attrs=read-write" in started.stderr
        assert not (workdir / "t.db").exists()
        pair.promote()
        accept(db, workdir, scope_file, 2)
        assert [r["source_lead_id"] for r in status_records(db)] == ["lead-1", "lead-2"]
        status = run_main("status", "--db", db)
        assert json.loads(status.stdout)["replication"]["mode"] == "single"


@pytest.mark.slow
def test_the_script_makes_a_pair_that_fails_over_and_leaves_nothing_behind(
        workdir: Path, scope_file: Path) -> None:
    require()
    pair_dir = Path(f"/tmp/runner-pgpair-{uuid.uuid4().hex[:12]}")  # reachable by postgres
    up = script("up", "--dir", pair_dir, "--database", "runner")
    try:
        assert up["result"] == "up" and up["made"] == "asynchronous"
        assert {n: f["role"] for n, f in up["nodes"].items()} == {"a": "primary",
                                                                   "b": "standby"}
        assert 5432 not in [f["port"] for f in up["nodes"].values()]
        assert up["replication"] == [{"standby": "b", "state": "streaming",
                                      "sync_state": "async", "replay_lag_bytes": 0}]
        ports = [f["port"] for f in up["nodes"].values()]
        assert up["dsn"] == (f"postgresql://{pgpair.load(pair_dir).superuser}@127.0.0.1:"
                             f"{ports[0]},127.0.0.1:{ports[1]}/runner"
                             "?target_session_attrs=read-write")
        db = f"{up['dsn']}&schema=pair"
        accept(db, workdir, scope_file, 1)
        # the standby falls behind on purpose: the primary goes on alone
        assert script("lag", "--dir", pair_dir)["replication"] == []
        accept(db, workdir, scope_file, 2)
        caught = script("catch-up", "--dir", pair_dir)
        assert caught["replication"][0]["replay_lag_bytes"] == 0
        pids = [pgpair.load(pair_dir).nodes[n].postmaster_pid() for n in ("a", "b")]
        over = script("failover", "--dir", pair_dir)
        assert (over["killed"], over["promoted"]) == ("a", "b")
        assert over["promotion_seconds"] > 0 and over["dsn"] == up["dsn"]
        after = script("status", "--dir", pair_dir)
        assert {n: f["role"] for n, f in after["nodes"].items()} == {"a": "down",
                                                                      "b": "primary"}
        # the same DSN finds the promoted node, which had both records
        accept(db, workdir, scope_file, 3)
        assert [r["source_lead_id"] for r in status_records(db)] == [
            "lead-1", "lead-2", "lead-3"]
    finally:
        down = script("down", "--dir", pair_dir)
    assert down["result"] == "down"
    assert not pair_dir.exists()
    assert not any(pid is not None and _alive(pid) for pid in pids)


def test_the_script_refuses_in_one_line(workdir: Path) -> None:
    require()
    missing = Path(f"/tmp/runner-pgpair-{uuid.uuid4().hex[:12]}")
    assert "no pair in" in script("status", "--dir", missing, code=1)
    assert "in use" in script("up", "--dir", missing, "--ports", "5432,5433", code=1)
    assert not missing.exists()


@pytest.mark.slow
def test_a_synchronous_pair_waits_for_its_standby_and_refuses_to_lag() -> None:
    with private_pair(synchronous=True) as pair:
        assert pair.replication()[0]["sync_state"] == "sync"
        primary = pair.primary()
        assert primary.fetch("SHOW synchronous_standby_names") == [("b",)]
        with pytest.raises(pgpair.PairError, match="lag is for an asynchronous pair"):
            pair.lag()
        # a commit the primary acknowledged is on the standby: nothing to wait for
        primary.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
        pair.failover()
        assert pair.primary().fetch("SELECT n FROM kept") == [(1,)]
        assert pair.primary().fetch("SHOW synchronous_standby_names") == [("",)]


@pytest.mark.slow
@pytest.mark.parametrize("hold", ["pause", "delay", "cut"])
def test_only_a_cut_stream_loses_an_acknowledged_commit_at_promotion(hold: str) -> None:
    """Why ``lag`` cuts the stream: a standby whose replay is paused or delayed has
    received the WAL, and promotion replays all of it; only WAL that never arrived is
    lost."""
    with private_pair(synchronous=False) as pair:
        standby, primary = pair.standby(), pair.primary()
        if hold == "pause":
            standby.execute("SELECT pg_wal_replay_pause()")
        elif hold == "delay":
            standby.execute("ALTER SYSTEM SET recovery_min_apply_delay = '1h'")
            standby.execute("SELECT pg_reload_conf()")
        else:
            pair.lag()
        primary.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
        if hold != "cut":  # wait until the standby has the WAL, not replayed yet
            lsn = primary.fetch("SELECT pg_current_wal_lsn()::text")[0][0]
            from tests.pgcluster import wait_until

            wait_until(lambda: standby.fetch(
                "SELECT pg_last_wal_receive_lsn() >= $1::text::pg_lsn", lsn)[0][0], 30,
                "the standby to receive the commit")
            assert not standby.fetch("SELECT to_regclass('kept') IS NOT NULL")[0][0]
        pair.failover()
        kept = pair.primary().fetch("SELECT to_regclass('kept') IS NOT NULL")[0][0]
        assert kept is (hold != "cut")
