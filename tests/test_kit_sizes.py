"""The conformance kit checks an adapter at the sizes runner sends (issue 29): one batch of
runner's default 1,000 (or the adapter's ``max_batch``), read back in one call, and as
many statuses in one call (at most ``max_read``).  It fails the two adapters that passed
it at 3 records and strand records under runner, against a real service process; the
careful adapter, and the careless one once it declares ``max_read``, pass and deliver."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from runner import DurableWorker
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import Observation, TargetRow
from runner.limits import DEFAULT_BATCH_SIZE
from runner.testing import Harness, check_adapter
from tests.helpers import SCOPE, event
from tests.rowskit import DeclaredOneUrl, FirstPage, OneUrl, Paged, rows_service

pytestmark = pytest.mark.timeout(180)

SIZES = {"healthy: batch", "healthy: read_back_many", "healthy: status of many"}


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    with rows_service() as url:
        yield url


def _failed(report: Any) -> dict[str, str]:
    return {c.name: c.detail for c in report.failures}


def test_an_adapter_that_puts_every_write_id_in_one_url_fails_the_kit(service: str) -> None:
    report = check_adapter(Harness(healthy=lambda: OneUrl(service)))
    failed = _failed(report)
    assert set(failed) == {"healthy: read_back_many", "healthy: status of many"}, report.text()
    assert "one read_back_many of 1000 write_ids" in failed["healthy: read_back_many"]
    assert "431" in failed["healthy: read_back_many"]
    assert "declares max_read" in failed["healthy: read_back_many"]
    assert "431" in failed["healthy: status of many"]


def test_an_adapter_that_reads_only_the_first_page_fails_the_kit(service: str) -> None:
    report = check_adapter(Harness(healthy=lambda: FirstPage(service)))
    failed = _failed(report)
    assert set(failed) == SIZES, report.text()
    assert "874 of 999 have no row" in failed["healthy: read_back_many"]
    assert "every page" in failed["healthy: read_back_many"]
    assert "875 of 1000 have no row" in failed["healthy: batch"]
    assert "875 Missing for rows that are there" in failed["healthy: status of many"]


@pytest.mark.parametrize("adapter", [Paged, DeclaredOneUrl])
def test_an_adapter_that_reads_within_the_service_limits_passes_the_kit(
        service: str, adapter: type[OneUrl]) -> None:
    report = check_adapter(Harness(healthy=lambda: adapter(service)))
    report.assert_passed()
    assert {c.name for c in report.checks if c.outcome == "passed"} >= SIZES


async def _deliver(adapter: Any, workdir: Path) -> list[tuple[int, int]]:
    """A default batch of 1,000 through runner: (uncertain, confirmed) after the dispatch
    cycle, and after the next cycle (whose reconcile pass reads every uncertain one back)."""
    found = []
    async with DurableWorker(str(workdir / "runner.db"), SCOPE, adapter) as worker:
        await worker.accept_many([event(i) for i in range(DEFAULT_BATCH_SIZE)])
        for _ in range(2):
            await worker.run_cycle()
            counts = (await worker.status())["counts"]
            found.append((counts["uncertain"], counts["confirmed"]))
    return found


@pytest.mark.parametrize(("adapter", "after"), [
    (OneUrl, [(1000, 0), (1000, 0)]),      # every readback refused: stranded for good
    (FirstPage, [(875, 125), (750, 250)]),  # 25 rows per 200 write_ids, pass after pass
])
async def test_what_the_kit_fails_strands_records_under_runner(
        service: str, workdir: Path, adapter: type[OneUrl],
        after: list[tuple[int, int]]) -> None:
    made = adapter(service)
    try:
        assert await _deliver(made, workdir) == after
    finally:
        made.close()


async def test_a_declared_max_read_lets_runner_confirm_a_default_batch(
        service: str, workdir: Path) -> None:
    made = DeclaredOneUrl(service)
    try:
        assert await _deliver(made, workdir) == [(0, 1000), (0, 1000)]
    finally:
        made.close()


class _Recording(SyntheticTarget):
    """The synthetic sheet, recording the size of every call the kit makes."""

    max_batch: Any = None
    max_read: Any = None

    def __init__(self, path: str, calls: dict[str, list[int]]) -> None:
        super().__init__(path)
        self.calls = calls

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        self.calls["write_batch"].append(len(items))
        super().write_batch(items)

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.calls["read_back_many"].append(len(write_ids))
        return super().read_back_many(write_ids)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        self.calls["observe_status"].append(len(write_ids))
        return super().observe_status(write_ids)


@pytest.mark.parametrize(("declared", "harness", "largest"), [
    ({}, {}, (1000, 1000, 1000)),
    ({"max_batch": 100}, {}, (100, 100, 1000)),
    ({"max_read": 50}, {}, (1000, 50, 50)),
    ({"max_batch": 100, "max_read": 300}, {}, (100, 100, 300)),
    ({}, {"batch_size": 250, "poll_limit": 100}, (250, 250, 100)),
    ({}, {"batch_size": 5000}, (5000, 5000, 1000)),
])
def test_the_kit_checks_at_runners_sizes_and_never_beyond_the_adapters_limits(
        workdir: Path, declared: dict[str, int], harness: dict[str, int],
        largest: tuple[int, int, int]) -> None:
    calls: dict[str, list[int]] = {"write_batch": [], "read_back_many": [],
                                   "observe_status": []}

    def made() -> _Recording:
        adapter = _Recording(str(workdir / "sheet.db"), calls)
        for name, value in declared.items():
            setattr(adapter, name, value)
        return adapter

    check_adapter(Harness(healthy=made, **harness)).assert_passed()
    assert tuple(max(calls[c]) for c in calls) == largest


@pytest.mark.parametrize("bad", [0, -1, 2.5, "1000", True])
def test_a_harness_size_that_is_not_a_positive_whole_number_is_refused(
        workdir: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_size must be a positive whole number"):
        Harness(healthy=lambda: SyntheticTarget(str(workdir / "s.db")), batch_size=bad)


@pytest.mark.parametrize("bad", [0, "100", 2.5])
def test_a_max_read_that_is_not_a_positive_whole_number_fails_the_kit(
        workdir: Path, bad: Any) -> None:
    def made() -> SyntheticTarget:
        adapter = SyntheticTarget(str(workdir / "s.db"))
        adapter.max_read = bad  # type: ignore[attr-defined]
        return adapter

    report = check_adapter(Harness(healthy=made))
    assert [(c.name, "max_read must be a positive whole number" in c.detail)
            for c in report.failures] == [("healthy: read_back_many", True)], report.text()
