"""Operators list and resolve uncertain records, on the record (issue 19 point 1; SPEC E5).

Arranged in process through the library; the commands run in process through
``runner.cli.main`` (output shapes, exit codes); a real worker process holds the lock
where the point is the lock.  Every test runs on both backends.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from runner import DurableWorker
from runner.cli import main
from runner.leads.port import TargetRow
from tests import pg
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import (
    SCOPE,
    Child,
    dump_store,
    event,
    ndjson,
    outbox_events,
    run_cli,
    write_json,
)

pytestmark = pytest.mark.timeout(120)

NOW = "2026-03-01T12:00:00Z"


class PinnedScripted(ScriptedAdapter):
    """The scripted adapter, with the synthetic target's identity: a store pins it, so the
    CLI's own synthetic target on the same file is the store's target.  Readbacks of the
    write_ids in ``fail_reads`` fail."""

    def __init__(self, path: Path, script: Any = None, fail_reads: frozenset[str] = frozenset()
                 ) -> None:
        super().__init__(path, script)
        self.fail_reads = fail_reads

    def target_id(self) -> str | None:
        return self.sheet.target_id()

    def prepare_writes(self, create: bool) -> None:
        self.sheet.prepare_writes(create)

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        if write_id in self.fail_reads:
            raise ConnectionError("scripted: read failed")
        return super().read_back(write_id)


def arrange(db: str, target: Path, scripts: Mapping[str, str], *,
            fail_reads: frozenset[str] = frozenset(), cycles: int = 1) -> dict[str, str]:
    """Accept one record per key of ``scripts`` and run ``cycles`` cycles, each record's
    send scripted (``tests.fakes.BEHAVIOURS``); returns key -> write_id."""

    async def go() -> dict[str, str]:
        by_write: dict[str, str] = {}
        adapter = PinnedScripted(target, lambda w: scripts[by_write[w]], fail_reads)
        async with DurableWorker(db, SCOPE, adapter) as worker:
            for key in scripts:
                result = await worker.accept(event(key))
                by_write[result.write_id] = key
            for _ in range(cycles):
                await worker.run_cycle()
        adapter.sheet.close()
        return {key: w for w, key in by_write.items()}

    return pg.run(go)


def cycle(db: str, target: Path, script: str = "ok") -> None:
    """One more cycle, every send scripted ``script``."""

    async def go() -> None:
        adapter = PinnedScripted(target, lambda _w: script)
        async with DurableWorker(db, SCOPE, adapter) as worker:
            await worker.run_cycle()
        adapter.sheet.close()

    pg.run(go)


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, Any, str]:
    """``runner ARGV`` in process: (exit code, its one JSON line, stderr)."""
    capsys.readouterr()  # what the arranging wrote is not this command's
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out
    return code, json.loads(lines[0]), err


def status(db: str) -> dict[str, Any]:
    proc = run_cli("status", "--db", db)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def records(db: str) -> list[dict[str, Any]]:
    """Every record in accept order (``status --records``, NDJSON), from a process."""
    proc = run_cli("status", "--db", db, "--records")
    assert proc.returncode == 0, proc.stderr
    return ndjson(proc.stdout)


def raw(db: str, sql: str) -> None:
    """One statement straight into the store, as a person with a SQL shell would."""
    if pg.is_pg(db):
        pg.execute(sql.replace("{s}", f'"{pg.schema_of(db)}".'))
        return
    conn = sqlite3.connect(db)
    try:
        conn.execute(sql.replace("{s}", ""))
        conn.commit()
    finally:
        conn.close()


def sheet(target: Path, sql: str) -> None:
    conn = sqlite3.connect(target)
    try:
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def target(workdir: Path) -> Path:
    return workdir / "target.db"


def test_uncertain_lists_each_record_with_its_last_readback_in_words(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    ids = arrange(db, target, {"no-row": "timeout_no_write", "differs": "write_then_timeout",
                               "two-rows": "write_then_timeout", "ok": "ok",
                               "unreadable": "timeout_no_write"})
    # the target changes behind runner's back before the next readback
    sheet(target, f"UPDATE sheet SET contact_alias = 'other' WHERE write_id = '{ids['differs']}'")
    sheet(target, "INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, "
                  "contact_alias) SELECT write_id, tenant, source, source_lead_id, is_test, "
                  f"contact_alias FROM sheet WHERE write_id = '{ids['two-rows']}'")
    # one cycle reads every uncertain record back (one read fails), then sends "newest",
    # which ends uncertain without a readback yet
    newest = arrange(db, target, {"newest": "timeout_no_write"},
                     fail_reads=frozenset({ids["unreadable"]}))

    code, doc, _ = cli(capsys, "uncertain", "--db", db, "--now", NOW)
    assert code == 0
    assert doc["count"] == 5 == len(doc["records"])
    assert [r["source_lead_id"] for r in doc["records"]] == [  # accept order
        "lead-no-row", "lead-differs", "lead-two-rows", "lead-unreadable", "lead-newest"]
    rows = {r["source_lead_id"]: r for r in doc["records"]}
    words = {key: r["last_reconcile_words"] for key, r in rows.items()}
    assert words == {"lead-no-row": "no row in the target", "lead-differs": "row differs",
                     "lead-two-rows": "two or more rows in the target",
                     "lead-unreadable": "target unreachable",
                     "lead-newest": "not read back yet"}
    assert rows["lead-no-row"]["last_reconcile"] == "none"
    assert rows["lead-unreadable"]["last_reconcile"] == "read_failed"
    assert rows["lead-newest"]["last_reconcile"] is None
    assert rows["lead-newest"]["last_reconcile_at"] is None
    assert rows["lead-no-row"]["last_reconcile_at"] is not None
    assert rows["lead-newest"]["write_id"] == newest["newest"]
    for row in rows.values():
        assert row["attempts"] == 1
        assert row["uncertain_since"] is not None
        assert isinstance(row["age_seconds"], int) and row["age_seconds"] >= 0
    assert "alias" not in json.dumps(doc)  # records by key, never by contact field


def test_uncertain_age_counts_from_when_the_record_became_uncertain(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    arrange(db, target, {"a": "timeout_no_write"})
    since = status(db)  # the uncertain mark's time is what the listing reports
    code, doc, _ = cli(capsys, "uncertain", "--db", db, "--now", "2100-01-01T00:00:00Z")
    assert code == 0 and since["counts"]["uncertain"] == 1
    row = doc["records"][0]
    from runner.clock import from_text, parse_now

    expected = parse_now("2100-01-01T00:00:00Z") - from_text(row["uncertain_since"])
    assert row["age_seconds"] == int(expected.total_seconds())


def test_not_sent_after_a_readback_that_finds_no_row_makes_it_sendable_once(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    ids = arrange(db, target, {"a": "timeout_no_write"})
    w = ids["a"]
    base = ["resolve", "--db", db, "--target", target, "--write-id", w, "--as", "not-sent",
            "--reason", "ticket 42: the request never left the proxy"]

    before = dump_store(db)
    code, doc, _ = cli(capsys, *base, "--dry-run")
    assert code == 0
    assert doc == {"result": "would_resolve", "write_id": w, "source_lead_id": "lead-a",
                   "as": "not-sent", "from_state": "uncertain", "to_state": "failed_safe",
                   "readback": "none", "attempts": 1}
    assert dump_store(db) == before  # a dry run changes nothing

    code, doc, err = cli(capsys, *base)
    assert code == 0 and doc["result"] == "resolved" and doc["to_state"] == "failed_safe"
    assert "lead.resolved" in err
    doc = status(db)
    assert doc["counts"]["failed_safe"] == 1 and doc["counts"]["uncertain"] == 0
    assert doc["outbox"]["by_kind"]["operator_resolved"] == 1
    (decision,) = doc["decisions"]
    assert decision["write_id"] == w and decision["decision"] == "not_sent"
    assert decision["reason"] == "ticket 42: the request never left the proxy"
    assert decision["readback"] == "none" and decision["attempts"] == 1
    events = [p for kind, p in outbox_events(db) if kind == "operator_resolved"]
    assert events == [{"tenant_id": SCOPE["tenant_id"], "write_id": w, "decision": "not_sent",
                       "reason": "ticket 42: the request never left the proxy",
                       "readback": "none", "attempts": 1}]
    moves = [(p["from"], p["to"]) for kind, p in outbox_events(db) if kind == "state_changed"]
    assert moves[-1] == ("uncertain", "failed_safe")

    code, doc, _ = cli(capsys, *base)  # only uncertain records: not a second time
    assert code == 65
    assert doc == {"result": "refused", "reason": "not_uncertain", "write_id": w,
                   "state": "failed_safe"}

    cycle(db, target)  # the next cycle sends it: one row in the target, attempts 2
    rec = records(db)[0]
    assert rec["state"] == "confirmed" and rec["attempts"] == 2
    assert [r[1] for r in sheet_rows(target)] == [w]


def test_not_sent_is_refused_while_the_target_holds_a_row(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    ids = arrange(db, target, {"same": "write_then_timeout", "differs": "write_then_timeout"})
    sheet(target, f"UPDATE sheet SET contact_alias = 'x' WHERE write_id = '{ids['differs']}'")
    before = dump_store(db)
    for key, verdict in (("same", "match"), ("differs", "mismatch")):
        code, doc, err = cli(capsys, "resolve", "--db", db, "--target", target, "--write-id",
                             ids[key], "--as", "not-sent", "--reason", "looked")
        assert code == 65, err
        assert doc == {"result": "refused", "reason": "row_present", "write_id": ids[key],
                       "readback": verdict}
        assert len(err.strip().splitlines()) == 1 and "nothing was changed" in err
    assert dump_store(db) == before


def test_not_sent_is_refused_when_the_target_cannot_be_read(
    db_location: str, target: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    w = arrange(db, target, {"a": "timeout_no_write"})["a"]
    other = workdir / "other.db"  # another target, with an identity of its own
    assert main(["once", "--db", str(workdir / "elsewhere.db"), "--scope",
                 str(write_json(workdir / "s.json", SCOPE)), "--target", str(other)]) == 0
    capsys.readouterr()
    before = dump_store(db)
    for where in (workdir / "absent.db", other, None):
        argv = ["resolve", "--db", db, "--write-id", w, "--as", "not-sent", "--reason", "r"]
        if where is not None:
            argv += ["--target", str(where)]
        code, doc, _ = cli(capsys, *argv)
        assert code == 65
        assert doc["result"] == "refused" and doc["write_id"] == w
        assert doc["reason"] == ("target_required" if where is None else "target_unreadable")
    assert not (workdir / "absent.db").exists()  # a read never creates a target
    assert dump_store(db) == before


def test_confirmed_needs_no_readback_and_is_recorded(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    w = arrange(db, target, {"a": "timeout_no_write"})["a"]
    code, doc, _ = cli(capsys, "resolve", "--db", db, "--write-id", w, "--as", "confirmed",
                       "--reason", "seen in the CRM's own export")
    assert code == 0
    assert doc["result"] == "resolved" and doc["to_state"] == "confirmed"
    assert doc["readback"] is None
    doc = status(db)
    assert doc["counts"]["confirmed"] == 1
    assert doc["decisions"][0]["decision"] == "confirmed"
    assert sheet_rows(target) == []  # runner wrote nothing to the target


def test_refusals_answer_on_stdout_and_change_nothing(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location
    ids = arrange(db, target, {"sent": "ok", "lost": "timeout_no_write"})
    before = dump_store(db)
    cases = [
        (["--write-id", "no-such-write-id", "--as", "confirmed", "--reason", "r"],
         "unknown_record"),
        (["--write-id", ids["sent"], "--as", "confirmed", "--reason", "r"], "not_uncertain"),
        (["--write-id", ids["lost"], "--as", "confirmed", "--reason", "   "],
         "invalid_reason"),
        (["--write-id", ids["lost"], "--as", "confirmed", "--reason", "x" * 1001],
         "invalid_reason"),
    ]
    for argv, reason in cases:
        code, doc, err = cli(capsys, "resolve", "--db", db, *argv)
        assert code == 65, err
        assert doc["result"] == "refused" and doc["reason"] == reason
        assert len(err.strip().splitlines()) == 1
    assert dump_store(db) == before


def test_the_store_refuses_a_resend_without_a_decision_for_that_episode(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing but a recorded not-sent decision for the record's current attempts moves
    it from uncertain to failed_safe, not even a hand-written UPDATE."""
    db = db_location
    w = arrange(db, target, {"a": "timeout_no_write"})["a"]
    move = f"UPDATE {{s}}leads SET state = 'failed_safe' WHERE write_id = '{w}'"
    with pytest.raises(Exception, match="illegal lead transition"):
        raw(db, move)
    code, _, _ = cli(capsys, "resolve", "--db", db, "--target", target, "--write-id", w,
                     "--as", "not-sent", "--reason", "first episode")
    assert code == 0
    # sent again, and uncertain again: the first decision does not authorise this episode
    cycle(db, target, "timeout_no_write")
    assert records(db)[0]["state"] == "uncertain"
    with pytest.raises(Exception, match="illegal lead transition"):
        raw(db, move)
    with pytest.raises(Exception, match="kept as recorded"):
        raw(db, "UPDATE {s}operator_decisions SET reason = 'rewritten'")
    with pytest.raises(Exception, match="kept as recorded"):
        raw(db, "DELETE FROM {s}operator_decisions")


def test_resolve_is_refused_while_a_worker_holds_the_lock(
    db_location: str, target: Path, workdir: Path, scope_file: Path
) -> None:
    """A resolve never runs beside a worker: its readback and commit can never race a
    worker's reconcile or dispatch."""
    db = db_location
    w = arrange(db, target, {"a": "timeout_no_write"})["a"]
    child = Child("start", "--db", db, "--scope", scope_file, "--target", target,
                  "--interval", "3600")
    try:
        child.wait_out_lines(1)  # its first cycle is done: it holds the lock
        proc = run_cli("resolve", "--db", db, "--target", target, "--write-id", w,
                       "--as", "not-sent", "--reason", "r")
        assert proc.returncode == 75, proc.stderr
        assert f"pid {child.proc.pid}" in proc.stderr or "runner pid=" in proc.stderr
        doc = status(db)  # (the worker's sweep writes beside it: compare the records)
        assert doc["decisions"] == [] and records(db)[0]["state"] == "uncertain"
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()
    proc = run_cli("resolve", "--db", db, "--target", target, "--write-id", w,
                   "--as", "not-sent", "--reason", "r")
    assert proc.returncode == 0, proc.stderr  # once the worker is gone


def test_the_latest_guard_allows_exactly_the_transition_table() -> None:
    """Migration texts are frozen; the guard v9 installs is the table of runner.leads.states,
    and v16 installs the same pairs again (looked up by ``instr``, not an ``IN`` list)."""
    from runner.io.sqlite import schema
    from runner.leads.states import allowed_pairs

    assert sorted(schema.V9_TRANSITIONS) == sorted(allowed_pairs())
    later = [v for v in schema.MIGRATIONS
             if v > 9 and "leads_transition_guard" in schema.MIGRATIONS[v]]
    assert later == [16]  # no other later migration installs another guard
    # v17 replaces only the evidence guard of uncertain -> failed_safe (SPEC E7)
    resend = [v for v in schema.MIGRATIONS
              if v > 9 and "leads_resend_needs_decision" in schema.MIGRATIONS[v]]
    assert resend == [17]
    assert schema.transition_tokens(schema.V9_TRANSITIONS) in schema.MIGRATIONS[16]
