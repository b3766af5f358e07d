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


# -- rows returned by a write (issue 29) ------------------------------------------------


class _Answering:
    """An adapter whose writes return rows (what ``answer`` makes of the request), and
    whose reads fail: a result can only come from the rows the write returned."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.written: list[list[tuple[CRMRecord, str]]] = []
        self.reads = 0

    def write_batch(self, items: list[tuple[CRMRecord, str]]) -> object:
        self.written.append(list(items))
        return self.answer(items) if callable(self.answer) else self.answer

    def write(self, record: CRMRecord, write_id: str) -> object:
        return self.write_batch([(record, write_id)])

    def read_back(self, write_id: str) -> list[TargetRow]:
        self.reads += 1
        raise TargetReadError("reads are down")

    def read_back_many(self, write_ids: list[str]) -> list[TargetRow]:
        self.reads += 1
        raise TargetReadError("reads are down")

    def observe_status(self, write_ids: list[str]) -> dict[str, object]:
        return {}


EVENTS = [LeadEvent.model_validate(event(i)) for i in (1, 2, 3)]


def _stored(items: list[tuple[CRMRecord, str]]) -> list[TargetRow]:
    return [TargetRow(w, r.fields(), "new") for r, w in items]


def _sent(adapter: object) -> list[str]:
    port = CRMRecordPort(adapter)  # type: ignore[arg-type]
    results = port.send_batch_blocking([(e, f"w{i}") for i, e in enumerate(EVENTS)])
    return [r.verdict for r in results]


def test_rows_returned_by_a_batch_write_confirm_it_without_a_read() -> None:
    adapter = _Answering(_stored)
    assert _sent(adapter) == ["match"] * 3
    assert adapter.reads == 0 and len(adapter.written) == 1
    # one record at a time too
    single = _Answering(_stored)
    result = CRMRecordPort(single).send_blocking(EV, "w1")  # type: ignore[arg-type]
    assert (result.verdict, single.reads) == ("match", 0)


def test_each_record_is_judged_by_its_own_returned_rows() -> None:
    def answer(items: list[tuple[CRMRecord, str]]) -> list[TargetRow]:
        rows = _stored(items)
        other = TargetRow("w2", {**rows[2].fields, "contact_alias": "changed"}, "new")
        return [rows[0], rows[0], rows[1], other]  # w0 twice, w2 differs
    assert _sent(_Answering(answer)) == ["ambiguous", "match", "mismatch"]


@pytest.mark.parametrize("answer", [
    lambda items: _stored(items)[:2],  # w2 without a row
    lambda items: [*_stored(items), TargetRow("w9", {}, "new")],  # another write_id
    lambda items: [tuple(row.__dict__.values()) for row in _stored(items)],  # not rows
    lambda items: "rows", lambda items: 3, lambda items: {"w0": []},
])
def test_returned_rows_that_do_not_cover_the_request_prove_nothing(answer) -> None:
    adapter = _Answering(answer)
    port = CRMRecordPort(adapter)  # type: ignore[arg-type]
    results = port.send_batch_blocking([(e, f"w{i}") for i, e in enumerate(EVENTS)])
    assert [r.verdict for r in results] == ["unproven"] * 3  # uncertain: reconciled
    assert results[0].error is not None and "the write returned" in results[0].error
    assert adapter.reads == 0


def test_a_write_that_returns_no_rows_is_read_back_as_before(workdir: Path) -> None:
    adapter = _Answering(None)
    assert _sent(adapter) == ["unproven"] * 3  # the read is what failed
    assert adapter.reads == 1
    sheet = SyntheticTarget(str(workdir / "target.db"))
    assert _sent(sheet) == ["match"] * 3  # the synthetic target returns none: read back
    sheet.close()


def test_the_fault_wrapper_passes_returned_rows_through() -> None:
    inner = _Answering(_stored)
    wrapped = FaultyAdapter(inner, frozenset())  # type: ignore[arg-type]
    assert _sent(wrapped) == ["match"] * 3
    assert wrapped.write(REC, "w1") == [TargetRow("w1", REC.fields(), "new")]
    with pytest.raises(AmbiguousWriteError):  # a fault after the request: the answer is lost
        FaultyAdapter(inner, frozenset({Fault.TIMEOUT})).write_batch(  # type: ignore[arg-type]
            [(REC, "w1")])
    assert _sent(FaultyAdapter(inner, frozenset({Fault.TIMEOUT}))) == ["failed"] * 3  # type: ignore[arg-type]
    assert inner.reads == 0


def test_write_batch_once_deduplicates_within_and_across_calls(workdir: Path) -> None:
    path = workdir / "target.db"
    sheet = SyntheticTarget(str(path))
    made, rows = sheet.write_batch_once([(REC, "w1"), (REC, "w1"), (REC, "w2")])
    assert made == 2 and sorted(r.write_id for r in rows) == ["w1", "w2"]
    made, rows = sheet.write_batch_once([(REC, "w2"), (REC, "w3")])
    assert made == 1
    # the rows as stored: the repeat shows its one existing row, typed as stored
    assert sorted((r.write_id, dict(r.fields)["is_test"], r.status) for r in rows) == [
        ("w2", True, "new"), ("w3", True, "new")]
    assert [r[1] for r in sheet_rows(path)] == ["w1", "w2", "w3"]
    sheet.close()


def test_write_batch_once_holds_under_concurrent_connections(workdir: Path) -> None:
    import threading

    path = workdir / "target.db"
    SyntheticTarget(str(path)).write_batch_once([(REC, "w0")])
    ids = [f"w{i}" for i in range(200)]
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def append(k: int) -> None:
        sheet = SyntheticTarget(str(path))  # a connection of its own
        try:
            start.wait()
            for chunk in range(0, 200, 20):
                sheet.write_batch_once([(REC, w) for w in ids[chunk : chunk + 20]])
        except BaseException as exc:
            errors.append(exc)
        finally:
            sheet.close()

    threads = [threading.Thread(target=append, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    written = [r[1] for r in sheet_rows(path)]
    assert sorted(written) == sorted(ids) and len(written) == len(set(written))
