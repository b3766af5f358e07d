"""The kit proves ``dedupes_write_id`` before runner may rely on it (SPEC E7, issue 29): a
target with a unique key and ``ON CONFLICT DO NOTHING`` is proven; a target that does not
deduplicate, one that refuses the repeated write, one that checks then inserts, and an
adapter that deduplicates only in its own memory each fail the checks they break; an
adapter that does not declare it is skipped, and the report says runner will not resend."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.io.faults import Fault, FaultyAdapter
from runner.io.synthetic_target import SyntheticTarget
from runner.testing import Harness, Report, check_adapter
from tests.dedupekit import ClaimsToDedupe, DedupingRows, SaysYes

pytestmark = pytest.mark.timeout(120)

DECLARED = "dedupe: declared"
ONE_BATCH = "dedupe: twice in one batch"
TWO_BATCHES = "dedupe: twice in two batches"
CONCURRENT = "dedupe: twice in two concurrent calls"
ANSWER = "dedupe: the repeated write's answer"
PROOF = [DECLARED, ONE_BATCH, TWO_BATCHES, CONCURRENT, ANSWER]


def _kit(make: Callable[[], Any]) -> Report:
    return check_adapter(Harness(healthy=make))


def _outcomes(report: Report) -> dict[str, str]:
    return {c.name: c.outcome for c in report.checks if c.name.startswith("dedupe:")}


def test_a_unique_key_target_is_proven_to_deduplicate(workdir: Path) -> None:
    report = _kit(lambda: DedupingRows(str(workdir / "rows.db"), "ignore"))
    assert _outcomes(report) == dict.fromkeys(PROOF, "passed"), report.text()
    assert report.dedupe_proven and report.dedupe == "proven"
    assert report.text().endswith("dedupes_write_id proven: runner may send again an "
                                  "uncertain record whose fresh readback shows no row")
    report.assert_passed(require_dedupe=True)


def test_the_proof_holds_through_the_fault_wrapper(workdir: Path) -> None:
    path = str(workdir / "rows.db")
    report = _kit(lambda: FaultyAdapter(DedupingRows(path, "ignore"), frozenset({Fault.SLOW})))
    assert report.dedupe_proven, report.text()


@pytest.mark.parametrize(("make", "broken"), [
    # a spreadsheet that declares it: two rows every way
    (lambda p, _: ClaimsToDedupe(p), {ONE_BATCH, TWO_BATCHES, CONCURRENT, ANSWER}),
    # never two rows, but a request with a write_id already there is refused whole
    (lambda p, _: DedupingRows(p, "refuse"), {ONE_BATCH, TWO_BATCHES, ANSWER}),
    # look up, then insert: two calls that overlap both insert
    (lambda p, race: DedupingRows(p, "check_then_insert", race), {CONCURRENT}),
    # the adapter remembers what it wrote: another adapter (a restart) writes it again
    (lambda p, _: DedupingRows(p, "client_cache"), {TWO_BATCHES, CONCURRENT, ANSWER}),
], ids=["no dedupe", "refuses the repeat", "check then insert", "client cache"])
def test_a_broken_claim_fails_the_checks_it_breaks(
        workdir: Path, make: Callable[[str, threading.Barrier], Any],
        broken: set[str]) -> None:
    path, race = str(workdir / "rows.db"), threading.Barrier(2, timeout=30)

    def healthy() -> Any:
        return make(path, race)

    report = _kit(healthy)
    assert {c.name for c in report.failures} == broken, report.text()
    assert not report.dedupe_proven and report.dedupe == "not_proven"
    assert "dedupes_write_id NOT proven" in report.text().splitlines()[-1]
    with pytest.raises(AssertionError, match="dedupes_write_id: required, but NOT proven"):
        report.assert_passed(require_dedupe=True)


def test_the_details_say_what_strands_and_what_doubles(workdir: Path) -> None:
    refused = {c.name: c.detail for c in _kit(
        lambda: DedupingRows(str(workdir / "a.db"), "refuse")).failures}
    assert "raised RejectedWrite" in refused[ANSWER]
    assert "failed_safe" in refused[ANSWER] and "refused every time" in refused[ANSWER]
    assert "the new record sent with it: no row" in refused[TWO_BATCHES]
    doubled = {c.name: c.detail for c in _kit(
        lambda: ClaimsToDedupe(str(workdir / "b.db"))).failures}
    assert doubled[CONCURRENT].startswith("the readback: 2 rows (call 1 returned normally")
    assert doubled[ONE_BATCH].endswith("the readback: 2 rows")


def test_an_adapter_that_does_not_declare_it_is_skipped_and_never_resent(
        workdir: Path) -> None:
    report = _kit(lambda: SyntheticTarget(str(workdir / "sheet.db")))
    skipped = {c.name: c.detail for c in report.skipped if c.name.startswith("dedupe:")}
    assert list(skipped) == PROOF
    assert set(skipped.values()) == {
        "does not declare dedupes_write_id: runner will not resend uncertain records for it"}
    assert not report.dedupe_proven and report.dedupe == "not_declared"
    assert report.text().splitlines()[-1] == (
        "dedupes_write_id not declared: runner will not resend uncertain records for this "
        "adapter (a readback or an operator decides them)")
    report.assert_passed()
    with pytest.raises(AssertionError, match="required, but not declared"):
        report.assert_passed(require_dedupe=True)


def test_a_declaration_that_is_not_a_bool_fails(workdir: Path) -> None:
    report = _kit(lambda: SaysYes(str(workdir / "sheet.db")))
    assert [(c.name, c.detail) for c in report.failures] == [
        (DECLARED, "the target adapter's dedupes_write_id must be True or False, not 'yes'")]
    assert {c.name for c in report.skipped} >= set(PROOF[1:])
    assert report.dedupe == "not_proven"


class _LearnsItFromItsTarget(DedupingRows):
    """Says it deduplicates only once it has read its target's identity (as an HTTP
    target learns it from its server's ``identity``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "ignore")
        self.identified = False

    @property  # type: ignore[override]
    def dedupes_write_id(self) -> bool:
        return self.identified

    def target_id(self) -> str:
        self.identified = True
        return "rows-with-a-unique-key"


def test_the_kit_reads_the_declaration_after_the_checks_before_work_as_runner_does(
        workdir: Path) -> None:
    report = _kit(lambda: _LearnsItFromItsTarget(str(workdir / "rows.db")))
    assert report.dedupe_proven, report.text()
