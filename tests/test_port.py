"""The CRM port, the synthetic target and the fault wrapper (L5, L9, L10)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runner.io.faults import Fault, FaultyAdapter, parse_faults
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord, LeadEvent
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    CRMRecordPort,
    Missing,
    ReadFailure,
    Snapshot,
    TargetReadError,
    TargetRow,
    classify_readback,
)
from tests.fakes import sheet_rows
from tests.helpers import event

EV = LeadEvent.model_validate(event(1))
REC = CRMRecord.from_event(EV)


def row(write_id: str = "w1", **fields: object) -> TargetRow:
    return TargetRow(write_id, {**REC.model_dump(), **fields}, "new")


@pytest.mark.parametrize(
    ("rows", "verdict"),
    [
        ([], "none"),
        ([row()], "match"),
        ([row(status="won")], "mismatch"),  # an unknown field is not the mapped record
        ([row(contact_alias="other")], "mismatch"),
        ([row(is_test=False)], "mismatch"),
        ([row(), row()], "ambiguous"),
        ([row("w2")], "none"),
        ([row("w2"), row()], "match"),
    ],
)
def test_classify_readback(rows: list[TargetRow], verdict: str) -> None:
    assert classify_readback(rows, REC, "w1") == verdict


def test_status_column_is_ignored_for_done() -> None:
    assert classify_readback([TargetRow("w1", REC.model_dump(), "won")], REC, "w1") == "match"


def test_port_maps_event_to_the_narrower_record() -> None:
    assert CRMRecordPort.map(EV).model_dump() == {
        "tenant": EV.tenant_id, "source": "meta", "source_lead_id": "lead-1",
        "is_test": True, "contact_alias": "alias-1"}


def test_sheet_is_exactly_the_spec_table_and_does_not_deduplicate(workdir: Path) -> None:
    path = workdir / "target.db"
    target = SyntheticTarget(str(path))
    target.write(REC, "w1")
    target.write(REC, "w1")
    target.close()
    conn = sqlite3.connect(path)
    cols = [(c[1], c[2], c[3], c[4]) for c in conn.execute("PRAGMA table_info(sheet)")]
    conn.close()
    assert cols == [
        ("row_id", "INTEGER", 0, None), ("write_id", "", 0, None), ("tenant", "", 0, None),
        ("source", "", 0, None), ("source_lead_id", "", 0, None), ("is_test", "", 0, None),
        ("contact_alias", "", 0, None), ("status", "TEXT", 1, "'new'"),
    ]
    assert len(sheet_rows(path)) == 2
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_readback_and_observe(workdir: Path) -> None:
    target = SyntheticTarget(str(workdir / "target.db"))
    target.write(REC, "w1")
    target.write(REC, "w2")
    target.write(REC, "w2")
    assert classify_readback(target.read_back("w1"), REC, "w1") == "match"
    assert classify_readback(target.read_back("w2"), REC, "w2") == "ambiguous"
    seen = target.observe_status(["w1", "w2", "w3"])
    assert seen["w1"] == Snapshot({"status": "new"})
    assert isinstance(seen["w2"], ReadFailure)
    assert seen["w3"] == Missing()
    target.close()


def test_target_errors_are_translated_at_the_edge(workdir: Path) -> None:
    broken = workdir / "not-a-db"
    broken.write_bytes(b"this is not sqlite" * 100)
    broken.chmod(0o600)
    target = SyntheticTarget(str(broken))
    with pytest.raises(BeforeWriteError):  # could not even open: nothing left
        target.write(REC, "w1")
    with pytest.raises(TargetReadError):
        target.read_back("w1")


def test_fault_wrapper(workdir: Path) -> None:
    path = workdir / "target.db"
    inner = SyntheticTarget(str(path))
    with pytest.raises(BeforeWriteError):
        FaultyAdapter(inner, frozenset({Fault.OUTAGE})).write(REC, "w1")
    assert sheet_rows(path) == []  # outage: nothing written
    with pytest.raises(AmbiguousWriteError):
        FaultyAdapter(inner, frozenset({Fault.TIMEOUT})).write(REC, "w2")
    assert [r[1] for r in sheet_rows(path)] == ["w2"]  # timeout: written, then failed
    with pytest.raises(TargetReadError):
        FaultyAdapter(inner, frozenset({Fault.READ_ERROR})).observe_status(["w2"])
    assert FaultyAdapter(inner, frozenset({Fault.OUTAGE})).read_back("w2")  # reads unaffected
    inner.close()


def test_parse_faults_refuses_unknown_and_unguarded_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.errors import UsageError

    assert parse_faults(["outage"]) == {Fault.OUTAGE}
    with pytest.raises(UsageError):
        parse_faults(["explode"])
    monkeypatch.delenv("RUNNER_HANG_DIR", raising=False)
    with pytest.raises(UsageError):
        parse_faults(["hang"])
