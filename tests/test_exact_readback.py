"""Confirmation is type-exact (SPEC L5, issue 29): a row whose field is equal in value but
of another type (``1`` for ``True``) is not the mapped record — for runner's readback and
for the conformance kit, whose detail names the field and both types."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runner import DurableWorker
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord, LeadEvent
from runner.leads.port import TargetRow, classify_readback, exactly
from runner.testing import Harness, check_adapter
from tests.helpers import SCOPE, event

pytestmark = pytest.mark.timeout(60)

REC = CRMRecord.from_event(LeadEvent.model_validate(event(1)))


def _row(**fields: Any) -> TargetRow:
    return TargetRow("w1", {**REC.fields(), **fields}, "new")


@pytest.mark.parametrize(("fields", "verdict"), [
    ({}, "match"),
    ({"is_test": 1}, "mismatch"),                 # 1 == True in Python; not the record
    ({"is_test": 1.0}, "mismatch"),
    ({"is_test": "true"}, "mismatch"),
    ({"contact_alias": ""}, "mismatch"),
])
def test_a_field_of_another_type_is_a_mismatch(fields: dict[str, Any], verdict: str) -> None:
    assert REC.is_test is True
    assert classify_readback([_row(**fields)], REC, "w1") == verdict


def test_a_none_field_matches_only_none() -> None:
    record = REC.model_copy(update={"contact_alias": None, "is_test": False})
    assert classify_readback([TargetRow("w1", record.fields())], record, "w1") == "match"
    assert classify_readback([TargetRow("w1", {**record.fields(), "is_test": 0})], record,
                             "w1") == "mismatch"


@pytest.mark.parametrize(("found", "same"), [
    ({"n": 1}, True), ({"n": 1.0}, False), ({"n": True}, False), ({}, False),
    ({"n": 1, "m": 1}, False),
])
def test_exactly_compares_names_values_and_types(found: dict[str, Any], same: bool) -> None:
    assert exactly(found, {"n": 1}) is same


class _IntBools(SyntheticTarget):
    """The synthetic sheet read back as SQLite stores it: is_test as 0 or 1."""

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return [TargetRow(r.write_id, {**r.fields, "is_test": int(r.fields["is_test"])},
                          r.status) for r in super().read_back(write_id)]

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        return [row for w in write_ids for row in self.read_back(w)]


def test_the_kit_fails_an_adapter_that_answers_1_for_true_naming_the_field_and_types(
        workdir: Path) -> None:
    report = check_adapter(Harness(healthy=lambda: _IntBools(str(workdir / "sheet.db"))))
    failed = {c.name: c.detail for c in report.failures}
    assert "healthy: write then read back" in failed and "healthy: exact fields" in failed
    assert "is_test came back as int, expected bool" in failed["healthy: write then read back"]
    assert "is_test came back as int, expected bool" in failed["healthy: exact fields"]
    assert "differ (is_test came back as int, expected bool)" in failed["healthy: batch"]


async def test_runner_does_not_confirm_a_row_of_other_types(workdir: Path) -> None:
    async with DurableWorker(str(workdir / "runner.db"), SCOPE,
                             _IntBools(str(workdir / "sheet.db"))) as worker:
        await worker.accept(event(1))
        summary = await worker.run_cycle()
        again = await worker.run_cycle()
        records = [r async for r in worker.store.iter_records()]
    assert (summary.dispatched, summary.confirmed, summary.uncertain) == (1, 0, 1)
    assert again.reconciled == 0  # read back again: still not the record
    assert [r.state.value for r in records] == ["uncertain"]
