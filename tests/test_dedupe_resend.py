"""A target that deduplicates by write_id (SPEC E7, issue 29): an uncertain record whose
fresh readback finds no row there is sent again by runner itself, on the backoff
schedule, with a kept authorisation and its outbox event; on every other target it stays
uncertain, whatever the clock or a restart says."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.clock import FixedClock
from runner.leads.models import CRMRecord, LeadEvent
from runner.leads.port import TargetReadError, TargetRow
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import (
    SCOPE,
    CliStore,
    event,
    last_json,
    outbox_events,
    run_command,
    worker_records,
)
from tests.procs.dedupe_adapter import DedupingRows
from tests.procs.example_adapter import JsonRowsTarget

pytestmark = pytest.mark.timeout(90)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Sheet(ScriptedAdapter):
    """The scripted sheet, made at once (a readback of a sheet that does not exist fails:
    it proves nothing)."""

    def __init__(self, path: Path, script: object = None) -> None:
        super().__init__(path, script)  # type: ignore[arg-type]
        self.sheet.prepare_writes(True)


class DedupingScripted(Sheet):
    """The scripted sheet, deduplicating: a write of a write_id the sheet holds adds no
    row (and answers as a first write would)."""

    dedupes_write_id = True

    def write(self, record: CRMRecord, write_id: str) -> None:
        try:
            held = self.sheet.read_back(write_id)
        except TargetReadError:  # no sheet yet: nothing is held
            held = []
        if held:
            self.writes.append(write_id)
            return
        super().write(record, write_id)


def _lost_once(lost: set[str]) -> object:
    """A script: the first write of each write_id times out before writing anything."""
    seen: set[str] = set()

    def script(write_id: str) -> str:
        if write_id in seen:
            return "ok"
        seen.add(write_id)
        return "timeout_no_write" if write_id in lost or not lost else "ok"
    return script


async def test_a_deduplicating_target_gets_an_uncertain_record_with_no_row_again(
        db_location: str, workdir: Path) -> None:
    clock = FixedClock(T0)
    adapter = DedupingScripted(workdir / "sheet.db", _lost_once(set()))
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock, retry_base=60,
                             retry_cap=600) as worker:
        for i in range(3):
            await worker.accept(event(i))
        first = await worker.run_cycle()
        assert (first.dispatched, first.uncertain) == (3, 3)
        # the readback finds no row: queued again, due on the backoff schedule (not yet)
        second = await worker.run_cycle()
        assert (second.requeued, second.dispatched, second.still_uncertain) == (3, 0, 0)
        recs = await worker_records(worker)
        assert {r["state"] for r in recs} == {"failed_safe"}
        assert {r["last_error"] for r in recs} == {
            "resend: the target deduplicates by write_id and holds no row"}
        assert (await worker.run_cycle()).dispatched == 0  # still waiting its backoff
        clock.at = T0 + timedelta(minutes=10)
        third = await worker.run_cycle()
        assert (third.dispatched, third.confirmed) == (3, 3)
        recs = await worker_records(worker)
    assert {r["state"] for r in recs} == {"confirmed"}
    assert {r["attempts"] for r in recs} == {2}
    assert sorted(r[1] for r in sheet_rows(workdir / "sheet.db")) == sorted(
        r["write_id"] for r in recs)
    authorized = [p for kind, p in outbox_events(db_location) if kind == "resend_authorized"]
    assert sorted(p["write_id"] for p in authorized) == sorted(r["write_id"] for r in recs)
    assert {(p["attempts"], p["readback"]) for p in authorized} == {(1, "none")}


async def test_a_target_that_does_not_deduplicate_never_gets_it_again(
        db_location: str, workdir: Path) -> None:
    clock = FixedClock(T0)
    adapter = Sheet(workdir / "sheet.db", _lost_once(set()))
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock, retry_base=0) as worker:
        for i in range(3):
            await worker.accept(event(i))
        assert (await worker.run_cycle()).uncertain == 3
        for hours in range(1, 6):  # no timer, empty readback or restart makes it sendable
            clock.at = T0 + timedelta(hours=hours)
            summary = await worker.run_cycle()
            assert (summary.requeued, summary.dispatched, summary.still_uncertain) == (0, 0, 3)
        recs = await worker_records(worker)
    assert {r["state"] for r in recs} == {"uncertain"}
    assert len(adapter.writes) == 3 and sheet_rows(workdir / "sheet.db") == []
    assert "resend_authorized" not in {kind for kind, _ in outbox_events(db_location)}


class LateOriginal(DedupingScripted):
    """The first write of a record is lost on the way, and lands just after the first
    readback that found no row (a request the target applies long after its sender gave
    up on it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, _lost_once(set()))
        self.in_the_network: list[tuple[CRMRecord, str]] = []

    def write(self, record: CRMRecord, write_id: str) -> None:
        if write_id not in self.writes:
            self.in_the_network.append((record, write_id))
        super().write(record, write_id)

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        rows = super().read_back(write_id)
        for record, late in self.in_the_network:
            self.sheet.write(record, late)  # arrives now, after the answer was read
        self.in_the_network.clear()
        return rows


async def test_a_row_that_arrives_after_the_empty_readback_is_confirmed_not_doubled(
        db_location: str, workdir: Path) -> None:
    """The original request lands between the readback that found no row and the resend:
    the target keeps its one row, and the resend's readback confirms it."""
    adapter = LateOriginal(workdir / "sheet.db")
    async with DurableWorker(db_location, SCOPE, adapter, clock=FixedClock(T0),
                             retry_base=0) as worker:
        await worker.accept(event(1))
        assert (await worker.run_cycle()).uncertain == 1
        assert sheet_rows(workdir / "sheet.db") == []
        summary = await worker.run_cycle()
        assert (summary.requeued, summary.dispatched, summary.confirmed) == (1, 1, 1)
        rec = (await worker_records(worker))[0]
    assert len(adapter.writes) == 2  # sent again ...
    assert [r[1] for r in sheet_rows(workdir / "sheet.db")] == [rec["write_id"]]  # ... once


def _event(i: int) -> LeadEvent:
    return LeadEvent.model_validate(event(i))


@pytest.mark.parametrize("what", ["mismatch", "read_failed"])
async def test_only_no_row_is_sent_again_on_a_deduplicating_target(
        db_location: str, workdir: Path, what: str) -> None:
    clock = FixedClock(T0)
    adapter = DedupingScripted(workdir / "sheet.db", _lost_once(set()))
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock, retry_base=0) as worker:
        await worker.accept(event(1))
        assert (await worker.run_cycle()).uncertain == 1
        write_id = (await worker_records(worker))[0]["write_id"]
        if what == "mismatch":  # a row with this write_id but other fields
            adapter.sheet.write(worker.port.map(_event(2)), write_id)
        else:
            adapter.read_fails = True
        for _ in range(3):
            summary = await worker.run_cycle()
            assert (summary.requeued, summary.dispatched, summary.still_uncertain) == (0, 0, 1)
        rec = (await worker_records(worker))[0]
    assert rec["state"] == "uncertain"
    assert len(adapter.writes) == 1


def _accept_many(cli_store: CliStore, n: int) -> None:
    path = cli_store.dir / "events.ndjson"
    path.write_text("".join(json.dumps(event(i)) + "\n" for i in range(n)))
    proc = cli_store.run("accept", "--records", path)
    assert proc.returncode == 0, proc.stderr


def test_a_crashed_batch_is_delivered_by_the_next_run_on_a_deduplicating_target(
        cli_store: CliStore, workdir: Path) -> None:
    """A whole batch marked in flight, then the process killed before its request: on a
    deduplicating target the next run sends it again itself and confirms every record,
    once each; the plain target's batch stays uncertain (reconcile only)."""
    rows = workdir / "rows.db"
    cli_store.target = rows
    _accept_many(cli_store, 50)
    spec = ["--target-adapter", "tests.procs.dedupe_adapter:make", "--batch-size", "50"]
    crashed = cli_store.once(*spec, "--fault", "crash-before-write")
    assert crashed.returncode == 73, crashed.stderr
    summary = cli_store.cli("once", *spec, "--retry-base", "0")
    assert (summary["recovered"], summary["requeued"], summary["dispatched"],
            summary["confirmed"], summary["still_uncertain"]) == (50, 50, 50, 50, 0)
    recs = cli_store.all_records()
    assert {r["state"] for r in recs} == {"confirmed"}
    found = DedupingRows(str(rows)).read_back_many([r["write_id"] for r in recs])
    assert sorted(r.write_id for r in found) == sorted(r["write_id"] for r in recs)


def test_a_crashed_batch_stays_uncertain_on_a_target_that_does_not_deduplicate(
        cli_store: CliStore, workdir: Path) -> None:
    rows = workdir / "rows.db"
    cli_store.target = rows
    _accept_many(cli_store, 20)
    spec = ["--target-adapter", "tests.procs.dedupe_adapter:plain", "--batch-size", "20"]
    assert cli_store.once(*spec, "--fault", "crash-before-write").returncode == 73
    for _ in range(2):
        summary = cli_store.cli("once", *spec, "--retry-base", "0")
        assert (summary["requeued"], summary["dispatched"], summary["still_uncertain"]) == (
            0, 0, 20)
    assert JsonRowsTarget(str(rows)).read_back_many(
        [r["write_id"] for r in cli_store.all_records()]) == []


def test_a_declaration_that_is_not_a_bool_is_refused_before_anything_is_sent(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.target = workdir / "rows.db"
    _accept_many(cli_store, 2)
    proc = run_command("once", "--db", cli_store.db, "--scope", cli_store.scope, "--target",
                       workdir / "rows.db", "--target-adapter",
                       "tests.procs.dedupe_adapter:says_yes_as_text")
    assert proc.returncode == 2, proc.stderr
    assert "dedupes_write_id must be True or False" in proc.stderr
    assert {r["state"] for r in cli_store.all_records()} == {"prepared"}


async def test_the_store_takes_a_resend_authorisation_only_for_the_current_episode(
        db_location: str, workdir: Path) -> None:
    """An authorisation at another ``attempts`` does not make a record sendable, not even
    by a hand-written UPDATE; authorisations are kept as recorded."""
    from tests.test_operators import raw

    adapter = Sheet(workdir / "sheet.db", _lost_once(set()))
    async with DurableWorker(db_location, SCOPE, adapter, clock=FixedClock(T0)) as worker:
        await worker.accept(event(1))
        assert (await worker.run_cycle()).uncertain == 1
        rec = (await worker_records(worker))[0]
    w = rec["write_id"]
    move = f"UPDATE {{s}}leads SET state = 'failed_safe' WHERE write_id = '{w}'"
    raw(db_location, "INSERT INTO {s}resend_authorizations (tenant_id, source_lead_id, "
        f"write_id, target_id, attempts, readback, decided_at) VALUES ('t', 'k', '{w}', "
        "NULL, 7, 'none', '2026-12-01T00:00:00.000000Z')")  # another episode's
    with pytest.raises(Exception, match="illegal lead transition"):
        raw(db_location, move)
    with pytest.raises(Exception, match="readback"):  # only an empty readback authorises
        raw(db_location, "INSERT INTO {s}resend_authorizations (tenant_id, source_lead_id, "
            f"write_id, target_id, attempts, readback, decided_at) VALUES ('t', 'k', '{w}', "
            "NULL, 1, 'match', '2026-12-01T00:00:00.000000Z')")
    with pytest.raises(Exception, match="kept as recorded"):
        raw(db_location, "UPDATE {s}resend_authorizations SET attempts = 1")
    with pytest.raises(Exception, match="kept as recorded"):
        raw(db_location, "DELETE FROM {s}resend_authorizations")
    raw(db_location, "INSERT INTO {s}resend_authorizations (tenant_id, source_lead_id, "
        f"write_id, target_id, attempts, readback, decided_at) VALUES ('t', 'k', '{w}', "
        "NULL, 1, 'none', '2026-12-01T00:00:00.000000Z')")
    raw(db_location, move)  # this episode's authorisation: the move is allowed


def test_resolve_all_reads_through_an_adapter_named_without_a_target(
        cli_store: CliStore, workdir: Path) -> None:
    """``--target-adapter`` alone names a target (its factory chooses where): resolve
    reads the records back through it instead of ignoring it."""
    from tests.helpers import run_main

    cli_store.target = workdir / "rows.db"  # where the adapter's factory writes by default
    _accept_many(cli_store, 4)
    spec = ["--target-adapter", "tests.procs.dedupe_adapter:plain", "--batch-size", "4"]
    assert cli_store.once(*spec, "--fault", "crash-before-write").returncode == 73
    proc = run_main("resolve", "--db", cli_store.db, *spec[:2], "--all", "--as", "not-sent",
                    "--reason", "batch crashed before its request", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["decided"] == 4
    assert {r["state"] for r in cli_store.all_records()} == {"failed_safe"}
