"""What is durable (issue 30 point 4): the replication guarantee decided from the server's
facts, as a plain role sees them, and ``--require-synchronous-replication`` refusing
events (accept exit 78, the webhook 503, /readyz not ready) unless it is synchronous.

The same against real primary/standby pairs: tests/test_pg_failover.py (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.errors import NotSynchronous
from runner.io.http.health import LoopState, readiness
from runner.replication import (
    SINGLE_FILE,
    Replication,
    Sender,
    SynchronousIntake,
    classify,
    parse_standby_names,
)
from tests.helpers import event, run_main, status_records, write_json
from tests.httpkit import body_of, serving

pytestmark = pytest.mark.timeout(60)

#: what a role without pg_read_all_stats sees of a standby streaming from the server
PLAIN_B = Sender("b", None, None)


@pytest.mark.parametrize(("text", "parsed"), [
    ("", (0, [])),
    ("b", (1, ["b"])),
    ('"B", c', (1, ["b", "c"])),
    ("FIRST 2 (a, b, c)", (2, ["a", "b", "c"])),
    ("any 1 (b,c)", (1, ["b", "c"])),
    ("2 (b, c)", (2, ["b", "c"])),
    ("*", (1, ["*"])),
])
def test_standby_names_are_read_as_the_server_reads_them(text: str, parsed: Any) -> None:
    assert parse_standby_names(text) == parsed


@pytest.mark.parametrize(("names", "commit", "senders", "mode", "ok"), [
    # no standby at all
    ("", "on", [], "single", False),
    # a standby, commits do not wait for it
    ("", "on", [PLAIN_B], "asynchronous", False),
    ("b", "local", [PLAIN_B], "asynchronous", False),
    ("b", "off", [PLAIN_B], "asynchronous", False),
    # commits wait for the named standby, seen by a plain role or a privileged one
    ("b", "on", [PLAIN_B], "synchronous", True),
    ("b", "remote_apply", [Sender("b", "streaming", "sync")], "synchronous", True),
    ("*", "remote_write", [Sender("x", "streaming", "sync")], "synchronous", True),
    # configured, but the standby is not there (or still catching up): commits wait
    ("b", "on", [], "synchronous", False),
    ("b", "on", [Sender("b", "catchup", "async")], "synchronous", False),
    ("ANY 2 (b, c)", "on", [PLAIN_B], "synchronous", False),
    # a base backup's WAL sender is no standby
    ("", "on", [Sender("pg_basebackup", "backup", "async")], "single", False),
])
def test_the_guarantee_follows_the_settings_and_the_standbys_seen(
        names: str, commit: str, senders: list[Sender], mode: str, ok: bool) -> None:
    found = classify(names=names, commit=commit, in_recovery=False, senders=senders)
    assert (found.mode, found.synchronous) == (mode, ok)
    assert found.at_risk is (mode == "asynchronous" or commit == "off")


def test_what_cannot_be_seen_is_said_so() -> None:
    hidden = classify(names="", commit="on", in_recovery=False, senders=None)
    assert hidden.mode == "unknown" and hidden.at_risk and not hidden.synchronous
    assert "may not see whether a standby streams" in hidden.detail
    named = classify(names="b", commit="on", in_recovery=False, senders=None)
    assert named.mode == "synchronous" and named.synchronous_connected is None
    standby = classify(names="", commit="on", in_recovery=True, senders=[])
    assert standby.mode == "standby" and not standby.synchronous


def test_each_mode_says_what_an_acknowledgement_survives() -> None:
    sync = classify(names="b", commit="on", in_recovery=False, senders=[PLAIN_B])
    assert sync.to_json() == {
        "mode": "synchronous", "standbys": 1, "synchronous_standbys": 1,
        "synchronous_connected": 1, "synchronous_commit": "on",
        "detail": "synchronous replication: every commit waits until 1 standby has it "
                  "(synchronous_commit on, 1 connected)"}
    waiting = classify(names="b", commit="on", in_recovery=False, senders=[])
    assert "of the 1 standby every commit waits for, only 0 are connected" in waiting.detail
    lossy = classify(names="", commit="on", in_recovery=False, senders=[PLAIN_B])
    assert "can be missing on the standby promoted in its place" in lossy.detail
    off = classify(names="", commit="off", in_recovery=False, senders=[])
    assert "lost even if this server only crashes" in off.detail
    assert SINGLE_FILE.to_json()["detail"] == "a single file, no replication"


class Facts:
    """An intake store whose replication is given; counts the commits that reached it."""

    def __init__(self, replication: Replication) -> None:
        self.now = replication
        self.commits = 0

    async def replication(self) -> Replication:
        return self.now

    async def accept(self, *args: Any) -> Any:
        self.commits += 1

    async def accept_many(self, items: Any, now: Any) -> Any:
        self.commits += 1
        return []


async def test_the_gate_reads_the_guarantee_before_every_commit() -> None:
    sync = classify(names="b", commit="on", in_recovery=False, senders=[PLAIN_B])
    facts = Facts(sync)
    gate = SynchronousIntake(facts)
    await gate.accept_many([], None)  # type: ignore[arg-type]
    facts.now = classify(names="", commit="on", in_recovery=False, senders=[])  # failover
    with pytest.raises(NotSynchronous, match="replication is not synchronous "
                                             r"\(single: a single server"):
        await gate.accept_many([], None)  # type: ignore[arg-type]
    with pytest.raises(NotSynchronous):
        await gate.accept(None, "", "", None)  # type: ignore[arg-type]
    assert facts.commits == 1
    assert NotSynchronous.exit_code == 78


@pytest.mark.parametrize(("replication", "required", "ready"), [
    (SINGLE_FILE, False, True),
    (SINGLE_FILE, True, False),
    (None, True, False),  # not read yet: not ready to take events
    (classify(names="b", commit="on", in_recovery=False, senders=[PLAIN_B]), True, True),
    (classify(names="b", commit="on", in_recovery=False, senders=[]), True, False),
])
def test_readiness_says_the_guarantee_and_refuses_with_the_option(
        replication: Replication | None, required: bool, ready: bool) -> None:
    state = LoopState(mode="serve", started_at=0.0, replication=replication,
                      require_synchronous=required)
    ok, body = readiness(state, True)
    assert ok is ready and body["ready"] is ready
    assert body["require_synchronous"] is required
    assert body["replication"] == (None if replication is None else replication.to_json())


def test_accept_refuses_a_single_file_with_one_line_and_stores_nothing(
        workdir: Path, scope_file: Path) -> None:
    db = workdir / "queue.db"
    run_main("accept", "--db", db, "--scope", scope_file, "--record",
             write_json(workdir / "e0.json", event(0)))
    for argv in (["--record", write_json(workdir / "e1.json", event(1))],
                 ["--records", write_json(workdir / "e.ndjson", event(2))]):
        proc = run_main("accept", "--db", db, "--scope", scope_file, *argv,
                        "--require-synchronous-replication")
        assert proc.returncode == 78, proc.stderr
        assert proc.stdout == "" and proc.stderr.count("\n") == 1
        assert ("not taking events: --require-synchronous-replication, and replication is "
                "not synchronous (single_file: a single file, no replication); nothing was "
                "stored") in proc.stderr
    assert [r["source_lead_id"] for r in status_records(db)] == ["lead-0"]
    config = workdir / "runner.toml"
    config.write_text("require-synchronous-replication = true\n")
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--config", config,
                    "--record", workdir / "e1.json")
    assert proc.returncode == 78, proc.stderr


def test_start_refuses_the_option_without_an_intake(workdir: Path, scope_file: Path) -> None:
    proc = run_main("start", "--db", workdir / "q.db", "--scope", scope_file, "--target",
                    workdir / "t.db", "--cycles", "1", "--require-synchronous-replication",
                    guard=False)
    assert proc.returncode == 2
    assert "--require-synchronous-replication is for an intake: give --listen" in proc.stderr


async def test_the_webhook_answers_503_and_readyz_is_not_ready(workdir: Path) -> None:
    db = str(workdir / "queue.db")
    async with serving(db, require_synchronous=True) as s:
        refused = await s.post(body_of(event(1)))
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"] == "not_synchronous"
        ready = await s.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["replication"]["mode"] == "single_file"
    async with serving(db) as s:  # without the option the same store takes it
        assert (await s.post(body_of(event(1)))).status_code == 200
        assert (await s.get("/readyz")).json()["require_synchronous"] is False
