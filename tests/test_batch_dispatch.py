"""Batched dispatch (issue 16): many records per target request, the same per-record
guarantees.  The port's batch write and readback, the synthetic target's atomic batch,
dispatch on both backends (in process, through the library), and the CLI as a user runs
it: stops, crashes inside a batch, and honest cycle summaries (real processes)."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.errors import UsageError
from runner.ids import WriteId
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import AmbiguousWriteError, BeforeWriteError, TargetRow
from runner.leads.states import IllegalTransition, LeadState
from runner.limits import BATCH_SIZE_RANGE
from runner.store import Store
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, Child, CliStore, event, last_json, run_main, wait_path


class BatchingAdapter(ScriptedAdapter):
    """The scripted sheet with a batch write: ``batch_script(write_ids)`` says what the
    request does (``ok``, ``before_write``, ``partial_then_timeout``: the first half of
    the rows lands, then the answer is lost; ``all_then_timeout``)."""

    def __init__(self, path: Path, batch_script: str = "ok") -> None:
        super().__init__(path)
        self.batch_script = batch_script
        self.requests: list[list[str]] = []
        self.readbacks = 0

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        self.requests.append([write_id for _, write_id in items])
        what = self.batch_script
        if what == "before_write":
            raise BeforeWriteError("scripted: not sent")
        if what == "partial_then_timeout":
            self.sheet.write_batch(items[: len(items) // 2])
            raise AmbiguousWriteError("scripted: some rows landed, then timed out")
        self.sheet.write_batch(items)
        if what == "all_then_timeout":
            raise TimeoutError("scripted: written, then timed out")

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.readbacks += 1
        return self.sheet.read_back_many(write_ids)


# -- the synthetic target -----------------------------------------------------------------


def _items(n: int) -> list[tuple[CRMRecord, str]]:
    from runner.leads.models import LeadEvent

    return [(CRMRecord.from_event(LeadEvent.model_validate(event(i))), f"w-{i}")
            for i in range(n)]


def test_the_synthetic_target_applies_a_batch_whole_and_reads_it_back_in_one_call(
    workdir: Path,
) -> None:
    target = SyntheticTarget(str(workdir / "t.db"))
    try:
        target.write_batch(_items(5))
        rows = target.read_back_many([f"w-{i}" for i in range(5)] + ["w-absent"])
    finally:
        target.close()
    assert sorted(r.write_id for r in rows) == [f"w-{i}" for i in range(5)]
    assert len(sheet_rows(workdir / "t.db")) == 5


def test_a_batch_that_fails_inside_the_target_leaves_no_row_at_all(workdir: Path) -> None:
    path = workdir / "t.db"
    target = SyntheticTarget(str(path))
    target.prepare_writes(create=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON sheet WHEN NEW.source_lead_id = "
                 "'lead-3' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    conn.commit()
    conn.close()
    try:
        with pytest.raises(AmbiguousWriteError):
            target.write_batch(_items(5))
    finally:
        target.close()
    assert sheet_rows(path) == []  # all rows or none


# -- dispatch through the library, on both backends ----------------------------------------


async def _accepted(worker: DurableWorker, n: int) -> None:
    for i in range(n):
        await worker.accept(event(i))


async def _states(worker: DurableWorker) -> dict[str, tuple[str, int]]:
    return {r.source_lead_id: (r.state.value, r.attempts)
            async for r in worker.store.iter_records()}


async def test_a_batch_is_one_request_and_every_record_is_confirmed_by_readback(
    db_location: str, workdir: Path
) -> None:
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3) as worker:
        await _accepted(worker, 7)
        summary = await worker.run_cycle()
        states = await _states(worker)
    assert [len(r) for r in adapter.requests] == [3, 3, 1]
    assert adapter.readbacks == 3 and adapter.writes == []
    assert (summary.dispatched, summary.confirmed, summary.still_uncertain) == (7, 7, 0)
    assert set(states.values()) == {("confirmed", 1)}
    assert len(sheet_rows(workdir / "t.db")) == 7


async def test_the_dispatch_limit_cuts_a_batch(db_location: str, workdir: Path) -> None:
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3) as worker:
        await _accepted(worker, 7)
        summary = await worker.run_cycle(dispatch_limit=5)
    assert [len(r) for r in adapter.requests] == [3, 2]
    assert summary.dispatched == 5


async def test_a_record_that_stops_being_dispatchable_after_the_page_ahead_was_read_is_not_sent(
    db_location: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next page is read while the page before it is sent; a record of it that someone
    else marks in flight in between is skipped by the guarded mark, never sent."""
    import threading

    import anyio.from_thread

    monkeypatch.setattr("runner.tasks.deliver.BATCH_PAGE", 3)  # pages of 3, batches of 3
    read_ahead = threading.Event()
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3) as worker:
        await _accepted(worker, 6)
        store = worker.store
        ids = {r.source_lead_id: r.write_id async for r in store.iter_records()}
        taken = ids[event(4)["source_lead_id"]]  # on the second page
        page = store.dispatchable_page

        async def reading(after_seq: int, limit: int, now: datetime | None = None) -> list:
            found = await page(after_seq, limit, now)
            if after_seq:
                read_ahead.set()
            return found

        monkeypatch.setattr(store, "dispatchable_page", reading)
        write_batch = adapter.write_batch

        def first_waits(items: Sequence[tuple[CRMRecord, str]]) -> None:
            if not adapter.requests:  # the first page's request: once the next is read
                assert read_ahead.wait(30)
                anyio.from_thread.run(store.finish_and_mark_batch, [], [taken],
                                      datetime.now(UTC))
            write_batch(items)

        monkeypatch.setattr(adapter, "write_batch", first_waits)
        summary = await worker.run_cycle()
        states = await _states(worker)
    assert [len(r) for r in adapter.requests] == [3, 2]
    assert taken not in {w for r in adapter.requests for w in r}
    assert states[event(4)["source_lead_id"]] == ("in_flight", 1)
    assert (summary.dispatched, summary.confirmed) == (5, 5)


async def test_an_adapter_max_batch_caps_every_write_and_every_reconcile_read(
    db_location: str, workdir: Path
) -> None:
    class Capped(BatchingAdapter):
        max_batch = 2

        def __init__(self, path: Path, batch_script: str) -> None:
            super().__init__(path, batch_script)
            self.read_sizes: list[int] = []

        def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
            self.read_sizes.append(len(write_ids))
            return super().read_back_many(write_ids)

    adapter = Capped(workdir / "t.db", "all_then_timeout")  # written, answer lost
    async with DurableWorker(db_location, SCOPE, adapter) as worker:  # default batch size
        await _accepted(worker, 5)
        first = await worker.run_cycle()
        assert [len(r) for r in adapter.requests] == [2, 2, 1]
        assert first.uncertain == 5
        adapter.read_sizes.clear()
        again = await worker.run_cycle()
    assert adapter.read_sizes == [2, 2, 1]  # the reconcile pass, a readback per chunk
    assert again.reconciled == 5 and len(sheet_rows(workdir / "t.db")) == 5


@pytest.mark.parametrize("bad", [0, -3, "100", 2.5, True])
async def test_an_adapter_max_batch_that_is_not_a_positive_whole_number_is_refused(
    db_location: str, workdir: Path, bad: object
) -> None:
    adapter = BatchingAdapter(workdir / "t.db")
    adapter.max_batch = bad  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="max_batch must be a positive whole number"):
        DurableWorker(db_location, SCOPE, adapter)


async def test_a_target_that_cannot_batch_is_sent_one_record_per_request(
    db_location: str, workdir: Path
) -> None:
    adapter = ScriptedAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=50) as worker:
        await _accepted(worker, 4)
        summary = await worker.run_cycle()
    assert len(adapter.writes) == 4 and summary.confirmed == 4


async def test_before_write_makes_the_whole_batch_sendable_again(
    db_location: str, workdir: Path
) -> None:
    adapter = BatchingAdapter(workdir / "t.db", "before_write")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=4,
                             retry_base=0) as worker:  # due again at once
        await _accepted(worker, 4)
        first = await worker.run_cycle()
        assert (first.failed_safe, first.uncertain) == (4, 0)
        adapter.batch_script = "ok"
        second = await worker.run_cycle()
        states = await _states(worker)
    assert second.confirmed == 4
    assert set(states.values()) == {("confirmed", 2)}  # sent twice: the first never left
    assert len(sheet_rows(workdir / "t.db")) == 4


@pytest.mark.parametrize("script", ["partial_then_timeout", "all_then_timeout"])
async def test_an_ambiguous_batch_is_uncertain_reconciled_per_record_never_resent(
    db_location: str, workdir: Path, script: str
) -> None:
    adapter = BatchingAdapter(workdir / "t.db", script)
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=4) as worker:
        await _accepted(worker, 4)
        first = await worker.run_cycle()
        assert (first.uncertain, first.still_uncertain) == (4, 4)
        adapter.batch_script = "ok"
        second = await worker.run_cycle()
        third = await worker.run_cycle()
        states = await _states(worker)
    landed = 2 if script == "partial_then_timeout" else 4
    assert len(adapter.requests) == 1  # never resent
    assert second.reconciled == landed and second.dispatched == 0
    assert third.still_uncertain == 4 - landed
    assert sorted(s for s, _ in states.values()) == sorted(
        ["confirmed"] * landed + ["uncertain"] * (4 - landed))
    assert {a for _, a in states.values()} == {1}
    assert len(sheet_rows(workdir / "t.db")) == landed


async def test_a_batch_readback_that_fails_leaves_every_record_uncertain(
    db_location: str, workdir: Path
) -> None:
    adapter = BatchingAdapter(workdir / "t.db")

    def fail(_ids: Sequence[str]) -> Sequence[TargetRow]:
        raise ConnectionError("scripted: read failed")

    adapter.read_back_many = fail  # type: ignore[method-assign]
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3) as worker:
        await _accepted(worker, 3)
        first = await worker.run_cycle()
        del adapter.read_back_many  # reads work again
        second = await worker.run_cycle()
    assert (first.uncertain, first.confirmed) == (3, 0)
    assert (second.reconciled, second.dispatched, second.still_uncertain) == (3, 0, 0)
    assert len(sheet_rows(workdir / "t.db")) == 3


async def test_the_batch_size_is_checked(db_location: str) -> None:
    with pytest.raises(UsageError):
        DurableWorker(db_location, SCOPE, batch_size=0)
    async with DurableWorker(db_location, SCOPE) as worker:
        with pytest.raises(UsageError):
            await worker.run_cycle(batch_size=BATCH_SIZE_RANGE[1] + 1)


def test_the_largest_batch_is_the_largest_the_reference_server_takes() -> None:
    from runner.io.targets.server import MAX_ROWS

    assert BATCH_SIZE_RANGE[1] == MAX_ROWS


async def test_a_batch_step_refuses_a_record_that_was_not_in_flight(store: Store) -> None:
    with pytest.raises(IllegalTransition):
        await store.finish_and_mark_batch(
            [(WriteId("nope"), LeadState.CONFIRMED)], [], datetime(2026, 12, 1, tzinfo=UTC))


# -- the CLI as a user runs it: stops, crashes, summaries (real processes) -----------------


def test_batch_size_out_of_range_exits_2(cli_store: CliStore) -> None:
    for bad in ("0", str(BATCH_SIZE_RANGE[1] + 1), "x"):
        proc = run_main("once", "--db", cli_store.db, "--scope", cli_store.scope,
                        "--target", cli_store.target, "--batch-size", bad, guard=False)
        assert proc.returncode == 2, proc.stderr


def _stopped_mid_request(s: CliStore, hang: Path, command: str, *extra: str,
                         hard: bool) -> tuple[int, dict[str, int]]:
    """Run ``command --fault hang`` until its request hangs, then SIGTERM it: a second
    SIGTERM (hard) or the request released (graceful).  Its exit code and last summary."""
    hang.mkdir()
    child = Child(command, "--db", s.db, "--scope", s.scope, "--target", s.target,
                  "--fault", "hang", *extra, env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-write", child)
        child.signal(signal.SIGTERM)
        child.wait_err("letting the send in flight finish")
        if hard:
            child.signal(signal.SIGTERM)
        else:
            (hang / "release").touch()
        code = child.finish(timeout=15)
    finally:
        child.kill()
    return code, last_json("\n".join(child.out))


@pytest.mark.parametrize("hard", [True, False], ids=["hard", "graceful"])
def test_a_stop_during_a_batch_request(cli_store: CliStore, workdir: Path, hard: bool) -> None:
    """A hard stop leaves the batch uncertain, and the summary says so; a graceful stop
    lets the request in flight finish.  Either way nothing is ever resent."""
    s = cli_store
    s.accept(1, 2, 3, 4)
    code, summary = _stopped_mid_request(s, workdir / "hang", "start", "--interval", "3600",
                                         "--batch-size", "3", hard=hard)
    after = "uncertain" if hard else "confirmed"
    assert code == (143 if hard else 0)
    assert (summary["dispatched"], summary[after], summary["still_uncertain"]) == (
        3, 3, 3 if hard else 0)
    recs = s.records()
    assert sorted(r["state"] for r in recs.values()) == sorted(["prepared"] + [after] * 3)
    healed = s.cli("once", "--batch-size", "3")
    assert (healed["reconciled"], healed["dispatched"], healed["still_uncertain"]) == (
        3 if hard else 0, 1, 0)
    assert {(r["state"], r["attempts"]) for r in s.records().values()} == {("confirmed", 1)}
    assert len(sheet_rows(s.target)) == 4  # the batch was never resent


def test_a_hard_stop_of_a_single_send_counts_it_uncertain(
    cli_store: CliStore, workdir: Path
) -> None:
    """Issue 16 point 5: the summary used to say ``uncertain: 0`` here."""
    cli_store.accept(1)
    code, summary = _stopped_mid_request(cli_store, workdir / "hang", "once",
                                         "--batch-size", "1", hard=True)
    assert code == 143
    assert (summary["uncertain"], summary["still_uncertain"]) == (1, 1)


def test_no_batch_is_dispatched_while_a_reconcile_hangs(
    cli_store: CliStore, workdir: Path
) -> None:
    s, hang = cli_store, workdir / "hang"
    hang.mkdir()
    s.accept(1)
    assert s.once("--fault", "crash-before-write").returncode == 73  # lead-1 in flight
    s.accept(2, 3, 4)
    child = Child("start", "--db", s.db, "--scope", s.scope, "--target", s.target,
                  "--cycles", "1", "--batch-size", "3", "--fault", "hang-readback",
                  env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-read_back", child)
        recs = s.records()
        assert [recs[f"lead-{i}"]["state"] for i in (2, 3, 4)] == ["prepared"] * 3
        assert sheet_rows(s.target) == []
        (hang / "release").touch()
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    recs = s.records()
    assert recs["lead-1"]["state"] == "uncertain"
    assert [recs[f"lead-{i}"]["state"] for i in (2, 3, 4)] == ["confirmed"] * 3


@pytest.mark.parametrize("point", [
    "dispatch.after-in-flight", "dispatch.batch-applied", "dispatch.after-write",
    "dispatch.batch-mid-readback", "dispatch.before-confirm",
])
def test_a_crash_inside_a_batch_loses_nothing_and_duplicates_nothing(
    cli_store: CliStore, point: str
) -> None:
    s = cli_store
    s.accept(1, 2, 3, 4, 5)
    crashed = s.once("--batch-size", "3", "--fault", f"crash-at:{point}")
    assert crashed.returncode == 73 and crashed.stdout == "", crashed.stderr
    in_flight = [k for k, r in s.records().items() if r["state"] == "in_flight"]
    assert len(in_flight) == 3  # the whole first batch: marked, outcome not recorded
    landed = len(sheet_rows(s.target))
    assert landed == (0 if point == "dispatch.after-in-flight" else 3)
    healed = s.cli("once", "--batch-size", "3")
    assert (healed["recovered"], healed["dispatched"]) == (3, 2)
    assert healed["reconciled"] == landed
    again = s.cli("once", "--batch-size", "3")  # nothing is ever resent
    assert again["dispatched"] == 0 and again["still_uncertain"] == 3 - landed
    recs = s.records()
    assert {r["attempts"] for r in recs.values()} == {1}
    keys = [r[4] for r in sheet_rows(s.target)]
    assert len(keys) == len(set(keys)) == landed + 2  # 0 duplicated
    assert len(recs) == 5  # 0 lost: every record is confirmed or uncertain (reconcile only)
    assert sum(r["state"] == "confirmed" for r in recs.values()) == landed + 2



def test_a_batch_logs_one_line_per_state_change_of_the_batch(cli_store: CliStore) -> None:
    s = cli_store
    s.accept(1, 2, 3)
    proc = s.once("--batch-size", "3", "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    docs = [json.loads(line) for line in proc.stderr.strip().splitlines()]
    batch = [(d["action"], d.get("keys"), d.get("count")) for d in docs
             if d["action"].startswith("batch.") or d["action"] in ("lead.in_flight",
                                                                    "lead.confirmed")]
    keys = ["lead-1", "lead-2", "lead-3"]
    assert batch == [("batch.in_flight", keys, 3), ("batch.confirmed", keys, 3)]
