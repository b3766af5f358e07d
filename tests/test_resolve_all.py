"""One command for many uncertain records (issue 29 point 4; SPEC E5, E7): ``runner
resolve --all`` decides every uncertain record whose fresh readback is conclusive for the
decision, in chunks, one audited decision per record, and leaves every other one alone.

Arranged in process through the library or the CLI; the crash, the lock and the signal are
real processes (a crashed ``once``, a running ``start``, a ``resolve --all`` stopped by
SIGTERM while a chunk is read back).  Every test runs on both backends.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from runner.cli import main
from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import (
    Child,
    dump_store,
    event,
    last_json,
    run_cli,
    run_main,
    status_records,
)
from tests.helpers import outbox_events as outbox
from tests.test_operators import arrange, cli, sheet, status

pytestmark = pytest.mark.timeout(180)

REASON = "INC-7: the batch's request never left (proxy log)"
ADAPTERS = "tests.procs.resolve_adapters"


@pytest.fixture
def target(workdir: Path) -> Path:
    return workdir / "target.db"


def accept_many(db: str, scope_file: Path, workdir: Path, n: int, first: int = 0) -> None:
    events = workdir / f"events-{first}.ndjson"
    events.write_text("".join(json.dumps(event(i)) + "\n" for i in range(first, first + n)))
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--records", events)
    assert proc.returncode == 0, proc.stderr


def crash_a_batch(db: str, scope_file: Path, target: Path, batch: int) -> None:
    """``once`` marks a batch in flight, then dies before the target is called (exit 73,
    a real process): the batch is in flight, with no row in the target."""
    proc = run_cli("once", "--db", db, "--scope", scope_file, "--target", target,
                   "--batch-size", str(batch), "--fault", "crash-before-write")
    assert proc.returncode == 73, proc.stderr


def by_key(db: str) -> dict[str, dict[str, Any]]:
    return {r["source_lead_id"]: r for r in status_records(db)}


def decisions(db: str) -> list[dict[str, Any]]:
    return [p for kind, p in outbox(db) if kind == "operator_resolved"]


ZERO = {"row_present": 0, "no_row": 0, "row_differs": 0, "two_rows": 0, "read_failed": 0,
        "not_uncertain": 0}


def test_one_resolve_all_settles_a_crashed_batch_and_the_next_once_sends_each_once(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 50)
    crash_a_batch(db, scope_file, target, 50)
    assert status(db)["counts"]["in_flight"] == 50 and sheet_rows(target) == []

    code, doc, err = cli(capsys, "resolve", "--all", "--db", db, "--target", target,
                         "--as", "not-sent", "--reason", REASON, "--batch-size", "20")
    assert code == 0, err
    assert doc == {"result": "resolved", "as": "not-sent", "to_state": "failed_safe",
                   "recovered": 50, "examined": 50, "decided": 50, "left": 0,
                   "left_by_reason": ZERO, "left_records": [], "left_truncated": False,
                   "chunks": 3, "stopped": False, "still_uncertain": 0}
    # one summary line per chunk, never one per record
    assert sum("batch.resolved" in line for line in err.splitlines()) == 3
    assert "lead.resolved" not in err
    counts = status(db)["counts"]
    assert counts["failed_safe"] == 50 and counts["uncertain"] == counts["in_flight"] == 0
    made = decisions(db)
    assert len(made) == 50 == len({d["write_id"] for d in made})
    assert {(d["decision"], d["reason"], d["readback"], d["attempts"]) for d in made} == {
        ("not_sent", REASON, "none", 1)}

    proc = run_main("once", "--db", db, "--scope", scope_file, "--target", target)
    assert proc.returncode == 0, proc.stderr
    rows = sheet_rows(target)
    records = status_records(db)
    assert len(rows) == 50 and sorted(r[1] for r in rows) == sorted(
        r["write_id"] for r in records)  # each record's row exactly once
    assert {(r["state"], r["attempts"]) for r in records} == {("confirmed", 2)}


def test_only_conclusive_readbacks_are_decided_the_rest_listed_and_unchanged(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    ids = arrange(db, target, {"gone-1": "timeout_no_write", "gone-2": "timeout_no_write",
                               "equal": "write_then_timeout", "differs": "write_then_timeout",
                               "doubled": "write_then_timeout", "unread": "timeout_no_write"})
    sheet(target, f"UPDATE sheet SET contact_alias = 'x' WHERE write_id = '{ids['differs']}'")
    sheet(target, "INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, "
                  "contact_alias) SELECT write_id, tenant, source, source_lead_id, is_test, "
                  f"contact_alias FROM sheet WHERE write_id = '{ids['doubled']}'")
    Path(str(target) + ".fail").write_text(ids["unread"] + "\n")
    adapter = ["--target-adapter", f"{ADAPTERS}:per_record"]  # one read per record
    before = by_key(db)
    # each send ended uncertain (its answer was lost), none read back yet
    assert {r["state"] for r in before.values()} == {"uncertain"}

    code, doc, _ = cli(capsys, "resolve", "--all", "--db", db, "--target", target, *adapter,
                       "--as", "not-sent", "--reason", REASON)
    assert code == 0
    assert doc["decided"] == 2 and doc["examined"] == 6
    left = {r["source_lead_id"]: (r["why"], r["readback"]) for r in doc["left_records"]}
    expected = {"lead-equal": ("row_present", "match"),
                "lead-differs": ("row_present", "mismatch"),
                "lead-doubled": ("row_present", "ambiguous"),
                "lead-unread": ("read_failed", "read_failed")}
    assert left == expected
    assert [r["source_lead_id"] for r in doc["left_records"]] == list(expected)  # accept order
    assert doc["left"] == 4 and doc["left_truncated"] is False
    assert doc["left_by_reason"] == {**ZERO, "row_present": 3, "read_failed": 1}
    assert {r["write_id"] for r in doc["left_records"]} == {
        ids[k.removeprefix("lead-")] for k in expected}
    after = by_key(db)
    assert after["lead-gone-1"]["state"] == after["lead-gone-2"]["state"] == "failed_safe"
    for key in expected:  # left alone: not a field changed
        assert after[key] == before[key]
    assert {d["write_id"] for d in decisions(db)} == {ids["gone-1"], ids["gone-2"]}

    # confirmed: only exactly one equal row counts; a row that differs, two rows and no
    # row (the failing read now passes) are left, each with its reason
    Path(str(target) + ".fail").write_text("")
    code, doc, _ = cli(capsys, "resolve", "--all", "--db", db, "--target", target, *adapter,
                       "--as", "confirmed", "--reason", "matched the CRM export")
    assert code == 0
    left = {r["source_lead_id"]: (r["why"], r["readback"]) for r in doc["left_records"]}
    assert left == {"lead-differs": ("row_differs", "mismatch"),
                    "lead-doubled": ("two_rows", "ambiguous"),
                    "lead-unread": ("no_row", "none")}
    assert doc["decided"] == 1 and doc["examined"] == 4
    assert by_key(db)["lead-equal"]["state"] == "confirmed"
    (equal,) = [d for d in decisions(db) if d["write_id"] == ids["equal"]]
    assert equal["decision"] == "confirmed" and equal["readback"] == "match"


def test_confirmed_all_records_the_operators_decision_with_its_matching_readback(
    db_location: str, target: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A record whose row is there and equal, but whose answer was lost and whose
    readback failed at the time: ``--as confirmed --all`` reads it back and confirms it,
    recorded as the operator's decision with the readback that proved it."""
    db = db_location
    ids = arrange(db, target, {"a": "write_then_timeout", "b": "write_then_timeout",
                               "none": "timeout_no_write"})
    assert status(db)["counts"]["uncertain"] == 3
    code, doc, _ = cli(capsys, "resolve", "--all", "--db", db, "--target", target,
                       "--as", "confirmed", "--reason", "seen in the CRM")
    assert code == 0
    with_rows = {"lead-a", "lead-b"}
    assert doc["decided"] == 2 and doc["to_state"] == "confirmed"
    assert doc["left_records"] == [{"write_id": ids["none"], "source_lead_id": "lead-none",
                                    "why": "no_row", "readback": "none"}]
    made = decisions(db)
    assert {d["write_id"] for d in made} == {ids[k.removeprefix("lead-")] for k in with_rows}
    assert {(d["decision"], d["readback"], d["reason"]) for d in made} == {
        ("confirmed", "match", "seen in the CRM")}
    assert len(sheet_rows(target)) == 2  # runner wrote nothing to the target
    after = by_key(db)
    assert all(after[k]["state"] == "confirmed" for k in with_rows)
    assert after["lead-none"]["state"] == "uncertain"


def test_a_chunk_whose_readback_fails_is_left_and_the_others_are_decided(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 30)
    crash_a_batch(db, scope_file, target, 30)
    code, doc, err = cli(capsys, "resolve", "--all", "--db", db, "--target", target,
                         "--target-adapter", f"{ADAPTERS}:second_chunk_fails",
                         "--as", "not-sent", "--reason", REASON, "--batch-size", "10")
    assert code == 0
    assert doc["decided"] == 20 and doc["left"] == 10 and doc["chunks"] == 3
    assert doc["left_by_reason"] == {**ZERO, "read_failed": 10}
    assert [r["source_lead_id"] for r in doc["left_records"]] == [
        f"lead-{i}" for i in range(10, 20)]  # the second chunk, in accept order
    assert "readback failed: TimeoutError" in err
    assert "runner uncertain" in err  # how to see every record left
    records = by_key(db)
    assert [records[f"lead-{i}"]["state"] for i in range(30)] == (
        ["failed_safe"] * 10 + ["uncertain"] * 10 + ["failed_safe"] * 10)
    assert doc["still_uncertain"] == 10


def test_the_answer_lists_at_most_100_records_left_and_says_it_is_truncated(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 120)
    crash_a_batch(db, scope_file, target, 120)
    code, doc, err = cli(capsys, "resolve", "--all", "--db", db, "--target", target,
                         "--as", "confirmed", "--reason", "checked", "--batch-size", "50")
    assert code == 0
    assert doc["decided"] == 0 and doc["left"] == 120
    assert doc["left_by_reason"] == {**ZERO, "no_row": 120}
    assert len(doc["left_records"]) == 100 and doc["left_truncated"] is True
    assert doc["left_records"][0]["source_lead_id"] == "lead-0"
    assert "'runner uncertain' lists" in err
    assert status(db)["counts"]["uncertain"] == 120  # recovered, and nothing more


def test_a_dry_run_reads_everything_back_and_changes_nothing(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 25)
    crash_a_batch(db, scope_file, target, 25)
    argv = ["resolve", "--all", "--db", db, "--target", target, "--as", "not-sent",
            "--reason", REASON, "--batch-size", "10"]
    outbox_before = status(db)["outbox"]["count"]
    before = dump_store(db)
    code, dry, err = cli(capsys, *argv, "--dry-run")
    assert code == 0
    assert status(db)["outbox"]["count"] == outbox_before
    assert dump_store(db) == before  # not even the recovery
    assert dry["result"] == "would_resolve" and dry["decided"] == 25
    assert dry["recovered"] == 25 and dry["chunks"] == 3
    assert "batch.would_resolve" in err and "batch.resolved" not in err
    code, real, _ = cli(capsys, *argv)
    assert code == 0 and real["result"] == "resolved"
    same = ("decided", "left", "left_by_reason", "recovered", "examined", "chunks")
    assert {k: real[k] for k in same} == {k: dry[k] for k in same}


def test_a_store_with_nothing_uncertain_answers_zero_counts(
    db_location: str, scope_file: Path, workdir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 2)
    absent = workdir / "absent-target.db"  # nothing to read back: the target is not read
    before = dump_store(db)
    code, doc, err = cli(capsys, "resolve", "--all", "--db", db, "--target", absent,
                         "--as", "not-sent", "--reason", REASON)
    assert code == 0
    assert doc == {"result": "resolved", "as": "not-sent", "to_state": "failed_safe",
                   "recovered": 0, "examined": 0, "decided": 0, "left": 0,
                   "left_by_reason": ZERO, "left_records": [], "left_truncated": False,
                   "chunks": 0, "stopped": False, "still_uncertain": 0}
    assert "no uncertain records" in err
    assert dump_store(db) == before and not absent.exists()


def test_usage_and_target_refusals_change_nothing(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 5)
    crash_a_batch(db, scope_file, target, 5)
    base = ["resolve", "--db", db, "--reason", REASON]
    before = dump_store(db)
    for argv in (["--all", "--write-id", "w", "--as", "not-sent", "--target", target],
                 ["--as", "not-sent", "--target", target]):
        capsys.readouterr()
        assert main([str(a) for a in base + argv]) == 2
        assert "--write-id" in capsys.readouterr().err
    other = workdir / "other.db"  # a target with an identity of its own
    assert main(["once", "--db", str(workdir / "elsewhere.db"), "--scope", str(scope_file),
                 "--target", str(other)]) == 0
    cases: list[tuple[list[Any], str]] = [
        (["--all", "--as", "confirmed"], "target_required"),
        (["--all", "--as", "not-sent"], "target_required"),
        (["--all", "--as", "not-sent", "--target", other], "target_unreadable"),
        (["--all", "--as", "confirmed", "--target", workdir / "absent.db"],
         "target_unreadable"),
        (["--all", "--as", "not-sent", "--target", target, "--reason", " "],
         "invalid_reason"),
    ]
    for argv, reason in cases:
        code, doc, err = cli(capsys, *base, *argv)
        assert code == 65, err
        assert doc["result"] == "refused" and doc["reason"] == reason
        assert len(err.strip().splitlines()) == 1
    assert dump_store(db) == before  # the in-flight records were not even recovered
    assert not (workdir / "absent.db").exists()


def test_resolve_all_is_refused_while_a_worker_holds_the_lock(
    db_location: str, scope_file: Path, target: Path,
) -> None:
    db = db_location
    arrange(db, target, {"a": "timeout_no_write", "b": "timeout_no_write"})
    child = Child("start", "--db", db, "--scope", scope_file, "--target", target,
                  "--interval", "3600")
    try:
        child.wait_out_lines(1)  # its first cycle is done: it holds the lock
        proc = run_cli("resolve", "--all", "--db", db, "--target", target, "--as",
                       "not-sent", "--reason", REASON)
        assert proc.returncode == 75, proc.stderr
        assert proc.stdout == ""
        assert status(db)["decisions"] == []
        assert status(db)["counts"]["uncertain"] == 2
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()
    proc = run_cli("resolve", "--all", "--db", db, "--target", target, "--as", "not-sent",
                   "--reason", REASON)
    assert proc.returncode == 0, proc.stderr  # once the worker is gone
    assert last_json(proc.stdout)["decided"] == 2


def test_sigterm_between_chunks_keeps_what_was_decided_and_leaves_the_rest(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
) -> None:
    """A real ``resolve --all`` process, signalled while its second chunk is read back:
    the first chunk's commit stands, the chunk being read is abandoned, nothing after it
    starts; the answer says so and the exit code is 0 (K4)."""
    db = db_location
    accept_many(db, scope_file, workdir, 30)
    crash_a_batch(db, scope_file, target, 30)
    child = Child("resolve", "--all", "--db", db, "--target", target,
                  "--target-adapter", f"{ADAPTERS}:gated", "--as", "not-sent",
                  "--reason", REASON, "--batch-size", "10")
    try:
        child.wait_err("gated: waiting")  # chunk 1 committed, chunk 2 being read back
        child.signal(signal.SIGTERM)
        child.wait_err("runner.stopping")
        Path(str(target) + ".go").write_text("")  # let the abandoned read return
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    (doc,) = [json.loads(line) for line in child.out]
    assert doc["stopped"] is True and doc["decided"] == 10 and doc["chunks"] == 1
    assert doc["still_uncertain"] == 20
    records = by_key(db)
    assert [records[f"lead-{i}"]["state"] for i in range(30)] == (
        ["failed_safe"] * 10 + ["uncertain"] * 20)
    assert len(decisions(db)) == 10
    proc = run_cli("resolve", "--all", "--db", db, "--target", target, "--as", "not-sent",
                   "--reason", REASON, "--batch-size", "10")
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["decided"] == 20  # the rest, by a second run


@pytest.mark.parametrize(("point", "decided"), [("resolve.before-commit", 0),
                                                 ("resolve.after-commit", 20)])
def test_a_crash_keeps_every_committed_chunk_and_nothing_of_the_next(
    db_location: str, scope_file: Path, target: Path, workdir: Path, point: str,
    decided: int,
) -> None:
    db = db_location
    accept_many(db, scope_file, workdir, 30)
    crash_a_batch(db, scope_file, target, 30)
    argv = ["resolve", "--all", "--db", db, "--target", target, "--as", "not-sent",
            "--reason", REASON, "--batch-size", "10"]
    after = "1" if point == "resolve.before-commit" else "2"
    proc = run_cli(*argv, env={"RUNNER_CRASH_AT": point, "RUNNER_CRASH_AFTER": after})
    assert proc.returncode == 73, proc.stderr
    counts = status(db)["counts"]
    assert counts["failed_safe"] == decided and counts["uncertain"] == 30 - decided
    assert len(decisions(db)) == decided
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["decided"] == 30 - decided
    assert len(decisions(db)) == 30  # one decision per record, whatever died when


def test_the_store_decides_a_record_once_per_uncertain_episode(db_location: str,
                                                                target: Path) -> None:
    """``record_operator_decisions`` writes a decision only for a record still uncertain at
    the attempts it was read back at, once per record however often it is named."""
    from runner.clock import parse_now
    from runner.ids import WriteId
    from runner.io.stores import open_store
    from runner.storedata import DecisionBatch

    db = db_location
    ids = arrange(db, target, {"a": "timeout_no_write", "b": "timeout_no_write",
                               "sent": "ok"})
    a, b, sent = (WriteId(ids[k]) for k in ("a", "b", "sent"))

    async def go() -> tuple[set[WriteId], set[WriteId]]:
        async with await open_store(db) as store:
            now = parse_now("2026-03-01T12:00:00Z")
            first = await store.record_operator_decisions(DecisionBatch(
                "not_sent", "r", "none", ((a, 1), (a, 1), (b, 2), (sent, 1))), now)
            again = await store.record_operator_decisions(DecisionBatch(
                "not_sent", "r", "none", ((a, 1), (b, 1))), now)
            return first, again

    first, again = pg.run(go)
    assert first == {a}  # b: another attempts count; sent: not uncertain
    assert again == {b}  # a is no longer uncertain
    assert sorted(d["write_id"] for d in decisions(db)) == sorted([a, b])
    records = by_key(db)
    assert records["lead-a"]["state"] == records["lead-b"]["state"] == "failed_safe"
    assert records["lead-sent"]["state"] == "confirmed"


def test_no_readback_request_carries_more_than_the_adapters_max_batch(
    db_location: str, scope_file: Path, target: Path, workdir: Path,
) -> None:
    """Through the library: 23 records, ``--batch-size`` 10, an adapter that takes at
    most 4 a request: six requests of at most 4, each chunk its own commit."""
    from runner.clock import SystemClock
    from runner.io.stores import open_store
    from runner.leads.port import CRMRecordPort
    from runner.tasks.resolve import resolve_all
    from tests.procs.resolve_adapters import Chunked

    class Capped(Chunked):
        max_batch = 4

        def __init__(self, target: str) -> None:
            super().__init__(target)
            self.sizes: list[int] = []

        def read_back_many(self, write_ids: Any) -> Any:
            self.sizes.append(len(write_ids))
            return super().read_back_many(write_ids)

    db = db_location
    accept_many(db, scope_file, workdir, 23)
    crash_a_batch(db, scope_file, target, 23)
    adapter = Capped(str(target))

    async def go() -> Any:
        async with await open_store(db) as store, store.worker_lock():
            return await resolve_all(store, CRMRecordPort(adapter), SystemClock(),
                                     "not-sent", REASON, chunk_size=10)

    result = pg.run(go)
    adapter.close()
    assert result.decided == 23 and result.chunks == 6
    assert adapter.sizes == [4, 4, 4, 4, 4, 3]
    assert status(db)["counts"]["failed_safe"] == 23
