"""The kit checks the rows a write returns (``runner.conformance.answer``, issue 29): runner
confirms a batch from them without a readback, so they must be the target's rows as it
holds them.  An adapter that answers with a readback made in the same call passes; one
that answers with the rows it sent, one that answers for part of the request, and one
whose answer drops a field's type fail the check they break; an adapter that answers
nothing is skipped, and one that answers but does not deduplicate is not written twice."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from runner.conformance.answer import ANSWER_CHECKS, HELD, NO_ROWS, ROWS
from runner.leads.models import CRMRecord
from runner.leads.port import TargetRow
from runner.testing import Harness, Report, check_adapter
from tests.dedupekit import DedupingRows

pytestmark = pytest.mark.timeout(120)


class Answers(DedupingRows):
    """Deduplicates by write_id, and answers a write with the rows the table then holds
    (read in the same call): what the kit asks for."""

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]
                    ) -> list[TargetRow]:  # type: ignore[override]
        super().write_batch(items)
        return list(self.read_back_many(list(dict.fromkeys(w for _, w in items))))

    def write(self, record: CRMRecord, write_id: str) -> list[TargetRow]:  # type: ignore[override]
        return self.write_batch([(record, write_id)])


class AnswersAsSent(Answers):
    """Answers with the rows it sent: right for new write_ids, wrong for a held one."""

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> list[TargetRow]:
        super().write_batch(items)
        return [TargetRow(w, r.fields(), "new") for r, w in dict(
            (w, (r, w)) for r, w in items).values()]


class AnswersPart(Answers):
    """Answers for all but the last write_id of a request."""

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> list[TargetRow]:
        rows = super().write_batch(items)
        return [row for row in rows if row.write_id != items[-1][1]]


class AnswersLoosely(Answers):
    """Answers with ``is_test`` as 1, where the target holds ``True``."""

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> list[TargetRow]:
        return [TargetRow(row.write_id, {**row.fields, "is_test": int(row.fields["is_test"])},
                          row.status) for row in super().write_batch(items)]


class AnswersNoDedupe(Answers):
    dedupes_write_id = False


def _kit(make: type[DedupingRows], path: Path) -> Report:
    return check_adapter(Harness(healthy=lambda: make(str(path))))


def _answer(report: Report) -> dict[str, tuple[str, str]]:
    return {c.name: (c.outcome, c.detail) for c in report.checks if c.name in ANSWER_CHECKS}


def test_an_answer_with_the_rows_as_held_passes(workdir: Path) -> None:
    report = _kit(Answers, workdir / "rows.db")
    assert _answer(report) == {ROWS: ("passed", ""), HELD: ("passed", "")}, report.text()
    report.assert_passed()


def test_an_answer_with_the_rows_as_sent_fails_for_a_held_write_id(workdir: Path) -> None:
    report = _kit(AnswersAsSent, workdir / "rows.db")
    found = _answer(report)
    assert found[ROWS][0] == "passed", report.text()  # new rows: as sent is as held
    outcome, detail = found[HELD]
    assert outcome == "failed"
    assert "1 of 2 write_ids differ from a readback" in detail
    assert "they differ in contact_alias" in detail and "never the row as sent" in detail


def test_an_answer_for_part_of_the_request_fails(workdir: Path) -> None:
    outcome, detail = _answer(_kit(AnswersPart, workdir / "rows.db"))[ROWS]
    assert outcome == "failed"
    assert "do not cover the request" in detail


def test_an_answer_that_loses_a_fields_type_fails(workdir: Path) -> None:
    found = _answer(_kit(AnswersLoosely, workdir / "rows.db"))
    assert found[ROWS][0] == "failed" and "they differ in is_test" in found[ROWS][1]
    assert "3 of 3 write_ids differ" in found[ROWS][1]


def test_a_write_that_answers_nothing_is_skipped(workdir: Path) -> None:
    report = _kit(DedupingRows, workdir / "rows.db")
    assert _answer(report) == {ROWS: ("skipped", NO_ROWS), HELD: ("skipped", NO_ROWS)}


def test_an_answering_target_that_does_not_deduplicate_is_not_written_twice(
        workdir: Path) -> None:
    path = workdir / "rows.db"
    report = check_adapter(Harness(healthy=lambda: AnswersNoDedupe(str(path), "ignore")))
    found = _answer(report)
    assert found[ROWS] == ("passed", "")
    assert found[HELD][0] == "skipped" and "second row" in found[HELD][1]
