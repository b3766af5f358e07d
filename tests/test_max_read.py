"""An adapter's ``max_read`` (issue 29): the most write_ids one read may carry.  runner
keeps every read to it — the readback after a batch, the reconcile pass, the poll pass's
status reads, and any caller of the port (``resolve``) — through the library, the fault
wrapper and the CLI; a value that is not a positive whole number is one usage error
(exit 2) before anything is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from runner import CRMRecordPort, DurableWorker
from runner.errors import UsageError
from runner.io.faults import Fault, FaultyAdapter
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import Observation, TargetReadError, TargetRow
from tests.helpers import SCOPE, CliStore, event, run_main

pytestmark = pytest.mark.timeout(60)

SPEC = "tests.procs.declared_adapter"


class _Capped(SyntheticTarget):
    """The synthetic sheet with ``max_read = 2``: it records the size of every read and
    refuses a read of more (so a read runner did not split fails the test)."""

    max_read: Any = 2

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads: list[int] = []
        self.statuses: list[int] = []
        self.lose_answers = False
        self.fail_status_after: int | None = None

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        super().write_batch(items)
        if self.lose_answers:
            raise TimeoutError("written, then the answer was lost")

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.reads.append(len(write_ids))
        if len(write_ids) > 2:
            raise TargetReadError("431: too many write_ids")
        return super().read_back_many(write_ids)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        self.statuses.append(len(write_ids))
        if len(write_ids) > 2 or (self.fail_status_after is not None
                                  and len(self.statuses) > self.fail_status_after):
            raise TargetReadError("431: too many write_ids")
        return super().observe_status(write_ids)


async def test_every_read_runner_makes_keeps_to_max_read(
        db_location: str, workdir: Path) -> None:
    adapter = _Capped(str(workdir / "sheet.db"))
    async with DurableWorker(db_location, SCOPE, adapter) as worker:  # default batch
        await worker.accept_many([event(i) for i in range(5)])
        sent = await worker.run_cycle()
        assert adapter.reads == [2, 2, 1] and sent.confirmed == 5  # the batch's readback
        await worker.accept_many([event(i) for i in range(5, 10)])
        adapter.lose_answers = True
        assert (await worker.run_cycle()).uncertain == 5
        adapter.lose_answers, adapter.reads = False, []
        assert (await worker.run_cycle()).reconciled == 5
        assert adapter.reads == [2, 2, 1]  # the reconcile pass
        polled = await worker.poll(100)
        assert adapter.statuses == [2, 2, 2, 2, 2] and polled.failed == 0
        assert polled.polled == 10
        # any caller of the port (resolve, resolve --all) reads in requests of max_read
        adapter.reads = []
        found = await worker.port.read_back_many(
            [r.write_id async for r in worker.store.iter_records()])
    assert adapter.reads == [2, 2, 2, 2, 2] and all(len(rows) == 1 for rows in found.values())


async def test_a_failed_status_request_fails_its_records_and_keeps_what_was_read(
        db_location: str, workdir: Path) -> None:
    adapter = _Capped(str(workdir / "sheet.db"))
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept_many([event(i) for i in range(5)])
        await worker.run_cycle()
        adapter.fail_status_after = 1  # the second status request fails
        polled = await worker.poll(100)
    assert adapter.statuses == [2, 2]  # no request after the one that failed
    assert (polled.polled, polled.changed, polled.failed) == (5, 2, 3)


def test_the_fault_wrapper_passes_max_read_through(workdir: Path) -> None:
    inner = _Capped(str(workdir / "sheet.db"))
    assert CRMRecordPort(FaultyAdapter(inner, frozenset({Fault.SLOW}))).max_read == 2
    assert FaultyAdapter(SyntheticTarget(str(workdir / "s.db")), frozenset()).max_read is None


@pytest.mark.parametrize("bad", [0, -3, "100", 2.5, True])
def test_a_max_read_that_is_not_a_positive_whole_number_is_refused(
        db_location: str, workdir: Path, bad: object) -> None:
    adapter = _Capped(str(workdir / "sheet.db"))
    adapter.max_read = bad
    with pytest.raises(UsageError, match="max_read must be a positive whole number"):
        DurableWorker(db_location, SCOPE, adapter)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_dedupe_declaration_that_is_not_a_bool_is_refused_when_the_port_is_made(
        workdir: Path, bad: object) -> None:
    adapter = _Capped(str(workdir / "sheet.db"))
    adapter.dedupes_write_id = bad  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="dedupes_write_id must be True or False"):
        CRMRecordPort(adapter)


def test_the_cli_keeps_every_read_to_a_loaded_adapters_max_read(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.target = workdir / "rows.db"
    cli_store.accept(1, 2, 3, 4, 5)
    adapter = ("--target-adapter", f"{SPEC}:make")
    lost = cli_store.cli("once", *adapter, "--fault", "timeout")  # written, answer lost
    assert lost["uncertain"] == 5
    # through the fault wrapper too: a read of more than two write_ids would fail
    again = cli_store.cli("once", *adapter, "--fault", "slow")
    assert (again["reconciled"], again["polled"], again["poll_failed"]) == (5, 5, 0)
    polled = cli_store.cli("poll-status", *adapter)
    assert (polled["polled"], polled["failed"]) == (5, 0)
    assert {r["state"] for r in cli_store.records().values()} == {"confirmed"}


@pytest.mark.parametrize(("factory", "says"), [
    ("zero", "max_read must be a positive whole number"),
    ("text", "max_read must be a positive whole number"),
    ("says_yes", "dedupes_write_id must be True or False, not 'yes'"),
])
def test_a_bad_declaration_is_one_clear_error_and_changes_nothing(
        cli_store: CliStore, workdir: Path, factory: str, says: str) -> None:
    cli_store.accept(1)
    proc = run_main("once", "--db", cli_store.db, "--scope", cli_store.scope,
                    "--target", str(workdir / "rows.db"), "--target-adapter",
                    f"{SPEC}:{factory}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert cli_store.records()["lead-1"]["state"] == "prepared"
    assert not (workdir / "rows.db").exists()
