"""The conformance kit (``runner.testing``, issues 17, 29) passes for both built-in targets
— the synthetic SQLite target and the HTTP adapter against real ``target-serve`` processes,
version 1 and version 2 (``--dedupe``), at runner's default batch of 1,000 — and fails an
adapter that breaks either promise."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from runner.conformance import marks as marks_proof
from runner.conformance.answer import ANSWER_CHECKS
from runner.io.faults import Fault, FaultyAdapter
from runner.io.synthetic_target import SyntheticTarget
from runner.io.targets.http import HttpTarget, Timeouts
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, Observation, TargetRow
from runner.testing import Condition, Harness, check_adapter
from tests.targetkit import target_server

pytestmark = pytest.mark.timeout(120)

MARKS_CHECKS = {marks_proof.DECLARED, *marks_proof.PROOF}
DEDUPE_CHECKS = {"dedupe: declared", "dedupe: twice in one batch", "dedupe: twice in two batches",
                 "dedupe: twice in two concurrent calls", "dedupe: the repeated write's answer"}


def test_the_synthetic_target_conforms(workdir: Path) -> None:
    path = str(workdir / "sheet.db")
    harness = Harness(
        healthy=lambda: SyntheticTarget(path),
        conditions={
            Condition.UNREACHABLE: lambda: SyntheticTarget(str(workdir / "no-dir" / "x.db")),
            Condition.APPLIED_THEN_LOST: lambda: FaultyAdapter(SyntheticTarget(path),
                                                               frozenset({Fault.TIMEOUT})),
        })
    report = check_adapter(harness)
    report.assert_passed(require=[Condition.UNREACHABLE, Condition.APPLIED_THEN_LOST])
    assert not [c for c in report.checks if c.name.startswith("healthy") and
                c.outcome != "passed"], report.text()
    # a spreadsheet: it never deduplicates, and does not say it does
    assert {c.name for c in report.skipped if c.name.startswith("dedupe:")} == DEDUPE_CHECKS
    assert not report.dedupe_proven


def test_the_http_adapter_conforms_against_the_reference_server(workdir: Path) -> None:
    store = workdir / "sheet.db"

    def faulty(*args: str) -> object:
        @contextmanager
        def opened() -> Iterator[HttpTarget]:
            with target_server(workdir, *args, "--grace", "0", store=store) as server:
                target = HttpTarget(server.url, timeouts=Timeouts(read=0.5))
                try:
                    yield target
                finally:
                    target.close()
        return opened

    with ExitStack() as stack:
        healthy = stack.enter_context(target_server(workdir, store=store))
        harness = Harness(
            healthy=lambda: HttpTarget(healthy.url),
            conditions={
                Condition.UNREACHABLE: faulty("--fault", "refuse"),
                Condition.RATE_LIMITED: faulty("--fault", "throttle"),
                Condition.REJECTED: faulty("--fault", "reject"),
                Condition.SERVER_ERROR: faulty("--fault", "error-before"),
                Condition.APPLIED_THEN_LOST: faulty("--fault", "drop-after-apply"),
                Condition.TIMEOUT_AFTER_APPLY: faulty("--fault", "slow-after-apply:30"),
            })
        report = check_adapter(harness)
    report.assert_passed(require=list(Condition))
    # all but the dedupe and marks proofs, which a version-1 server does not claim, and
    # the checks of a write's rows, which a version-1 append does not answer with
    assert {c.name for c in report.skipped} == DEDUPE_CHECKS | MARKS_CHECKS | set(
        ANSWER_CHECKS), report.text()
    assert report.dedupe == "not_declared"


def test_the_http_adapter_conforms_against_a_deduplicating_server(workdir: Path) -> None:
    """The same kit against ``target-serve --dedupe`` (protocol version 2: rows in the
    append's answer, a declared dedupe).  Each adapter reads the server's identity first,
    as runner does before any work, so it speaks version 2 and declares the dedupe."""
    store = workdir / "sheet.db"

    def identified(url: str, timeouts: Timeouts | None = None) -> HttpTarget:
        target = HttpTarget(url, timeouts=timeouts)
        target.target_id()
        assert target.dedupes_write_id
        return target

    def faulty(*args: str, identify: bool = True) -> object:
        @contextmanager
        def opened() -> Iterator[HttpTarget]:
            with target_server(workdir, "--dedupe", *args, "--grace", "0",
                               store=store) as server:
                target = (identified(server.url, Timeouts(read=0.5)) if identify
                          else HttpTarget(server.url))
                try:
                    yield target
                finally:
                    target.close()
        return opened

    with ExitStack() as stack:
        healthy = stack.enter_context(target_server(workdir, "--dedupe", "--marks",
                                                    store=store))
        harness = Harness(
            healthy=lambda: identified(healthy.url),
            conditions={
                Condition.UNREACHABLE: faulty("--fault", "refuse", identify=False),
                Condition.RATE_LIMITED: faulty("--fault", "throttle"),
                Condition.REJECTED: faulty("--fault", "reject"),
                Condition.SERVER_ERROR: faulty("--fault", "error-before"),
                Condition.APPLIED_THEN_LOST: faulty("--fault", "drop-after-apply"),
                Condition.TIMEOUT_AFTER_APPLY: faulty("--fault", "slow-after-apply:30"),
            })
        report = check_adapter(harness)
    report.assert_passed(require=list(Condition))
    assert not report.skipped, report.text()
    # the kit's dedupe and marks proofs ran against the server's declarations, and passed
    assert report.dedupe_proven and report.marks_proven, report.text()
    assert {c.name for c in report.checks if c.outcome == "passed"} >= DEDUPE_CHECKS | set(
        ANSWER_CHECKS)


class _Careless:
    """An adapter that breaks both promises: a timeout after sending is "not sent", and a
    failed read is "no rows"."""

    def __init__(self, inner: SyntheticTarget, *, lose_answers: bool = False) -> None:
        self.inner, self.lose_answers = inner, lose_answers

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.inner.write(record, write_id)
        if self.lose_answers:
            raise BeforeWriteError("timed out")  # wrong: the row was applied

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        try:
            return self.inner.read_back(write_id)
        except Exception:
            return []

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        return self.inner.observe_status(write_ids)


def test_an_adapter_that_breaks_the_promises_fails_the_kit(workdir: Path) -> None:
    path = str(workdir / "sheet.db")
    harness = Harness(
        healthy=lambda: SyntheticTarget(path),
        conditions={
            Condition.UNREACHABLE: lambda: _Careless(
                SyntheticTarget(str(workdir / "no-dir" / "x.db"))),
            Condition.APPLIED_THEN_LOST: lambda: _Careless(SyntheticTarget(path),
                                                           lose_answers=True),
        })
    report = check_adapter(harness)
    failed = {c.name for c in report.failures}
    # the careless write stops at its first record: the second is never applied either
    assert failed == {"unreachable: read back", "applied_then_lost: write",
                      "applied_then_lost: read back"}, report.text()
    with pytest.raises(AssertionError, match="does not conform"):
        report.assert_passed()
