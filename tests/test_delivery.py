"""The cycle in process, through the library API (L4-L8, L14)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from runner.errors import LockHeld
from runner.leads.models import CRMRecord, LeadEvent
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, event, worker_records


@pytest.fixture
def target(workdir: Path) -> Path:
    return workdir / "target.db"


async def records(worker: DurableWorker) -> dict[str, dict]:
    return {r["source_lead_id"]: r for r in await worker_records(worker)}


async def test_confirmed_on_exact_readback(db_location: str, target: Path) -> None:
    adapter = ScriptedAdapter(target)
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        for i in range(3):
            await worker.accept(event(i))
        summary = await worker.run_cycle()
        assert summary.to_json() == {"recovered": 0, "reconciled": 0, "requeued": 0,
                                     "dispatched": 3, "confirmed": 3, "failed_safe": 0,
                                     "uncertain": 0,
                                     "poll_failed": 0,
                                     "polled": 0, "still_uncertain": 0}
        recs = await records(worker)
        again = await worker.run_cycle()
    assert {r["state"] for r in recs.values()} == {"confirmed"}
    assert {r["attempts"] for r in recs.values()} == {1}
    assert again.dispatched == 0
    assert len(sheet_rows(target)) == 3
    assert [r[4] for r in sheet_rows(target)] == ["lead-0", "lead-1", "lead-2"]  # accept order


@pytest.mark.parametrize(
    ("behaviour", "state", "rows"),
    [
        ("before_write", "failed_safe", 0),
        ("write_then_timeout", "uncertain", 1),
        ("timeout_no_write", "uncertain", 0),
        ("other_exception", "uncertain", 0),
    ],
)
async def test_send_outcomes(
    db_location: str, target: Path, behaviour: str, state: str, rows: int
) -> None:
    adapter = ScriptedAdapter(target, lambda _w: behaviour)
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        await worker.run_cycle()
        rec = (await records(worker))["lead-1"]
    assert rec["state"] == state and rec["attempts"] == 1
    assert len(sheet_rows(target)) == rows


async def test_failed_safe_is_sent_again_uncertain_never(db_location: str, target: Path) -> None:
    plan = {"lead-1": ["before_write", "ok"], "lead-2": ["timeout_no_write"]}
    by_write: dict[str, str] = {}

    def script(write_id: str) -> str:
        return plan[by_write[write_id]].pop(0)

    adapter = ScriptedAdapter(target, script)
    # retry_base 0: due again at once (the backoff is tests/test_pacing.py's)
    async with DurableWorker(db_location, SCOPE, adapter, retry_base=0) as worker:
        for i in (1, 2):
            result = await worker.accept(event(i))
            by_write[result.write_id] = f"lead-{i}"  # type: ignore[index]
        first = await worker.run_cycle()
        for _ in range(4):
            await worker.run_cycle()
        recs = await records(worker)
    assert (first.failed_safe, first.uncertain) == (1, 1)
    assert recs["lead-1"]["state"] == "confirmed" and recs["lead-1"]["attempts"] == 2
    # the uncertain record was never sent again: one write call, ever
    assert recs["lead-2"]["state"] == "uncertain" and recs["lead-2"]["attempts"] == 1
    assert recs["lead-2"]["reconcile_attempts"] == 4
    assert adapter.writes.count(next(w for w, k in by_write.items() if k == "lead-2")) == 1


async def test_write_then_timeout_is_confirmed_by_the_next_readback(
    db_location: str, target: Path
) -> None:
    calls = iter(["write_then_timeout"])
    adapter = ScriptedAdapter(target, lambda _w: next(calls))
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        first = await worker.run_cycle()
        second = await worker.run_cycle()
        rec = (await records(worker))["lead-1"]
    assert first.uncertain == 1 and second.reconciled == 1
    assert rec["state"] == "confirmed" and rec["attempts"] == 1
    assert rec["reconcile_attempts"] == 1
    assert len(adapter.writes) == 1 and len(sheet_rows(target)) == 1


async def test_two_rows_stay_uncertain_with_one_ambiguous_event(
    db_location: str, target: Path
) -> None:
    adapter = ScriptedAdapter(target, lambda _w: "write_then_timeout")
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        result = await worker.accept(event(1))
        await worker.run_cycle()
        # someone else appended the same row again: the sheet now has two
        adapter.sheet.write(CRMRecord.from_event(LeadEvent.model_validate(event(1))),
                            str(result.write_id))
        for _ in range(3):
            await worker.run_cycle()
        doc = await worker.status()
        records = await worker_records(worker)
    rec = records[0]
    assert rec["state"] == "uncertain" and rec["reconcile_attempts"] == 3
    assert doc["uncertain"] == {"total": 1, "truncated": False, "records": [rec]}
    assert doc["outbox"]["by_kind"].get("target_ambiguous") == 1


async def test_readback_failure_counts_an_attempt_and_proves_nothing(
    db_location: str, target: Path
) -> None:
    adapter = ScriptedAdapter(target, lambda _w: "write_then_timeout")
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        await worker.run_cycle()
        adapter.read_fails = True
        await worker.run_cycle()
        rec = (await records(worker))["lead-1"]
        adapter.read_fails = False
        await worker.run_cycle()
        after = (await records(worker))["lead-1"]
    assert (rec["state"], rec["reconcile_attempts"]) == ("uncertain", 1)
    assert (after["state"], after["reconcile_attempts"]) == ("confirmed", 2)


async def test_dispatch_waits_for_every_reconcile(db_location: str, target: Path) -> None:
    """L8: dispatch starts only after every reconcile call of the cycle has returned."""
    order: list[str] = []
    first = iter(["timeout_no_write"])
    adapter = ScriptedAdapter(target, lambda _w: next(first, "ok"))
    real_read, real_write = adapter.read_back, adapter.write
    adapter.read_back = lambda w: (order.append("read"), real_read(w))[1]  # type: ignore
    adapter.write = lambda r, w: (order.append("write"), real_write(r, w))[1]  # type: ignore
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        await worker.run_cycle()  # lead-1 uncertain
        for i in (2, 3):
            await worker.accept(event(i))
        order.clear()
        await worker.run_cycle()
    # the reconcile read of lead-1 first; then each send followed by its own readback
    assert order == ["read", "write", "read", "write", "read"]


async def test_dispatch_limit(db_location: str, target: Path) -> None:
    async with DurableWorker(db_location, SCOPE, ScriptedAdapter(target)) as worker:
        for i in range(5):
            await worker.accept(event(i))
        assert (await worker.run_cycle(dispatch_limit=2)).dispatched == 2
        assert (await worker.run_cycle()).dispatched == 3


async def test_second_worker_in_process_is_refused(db_location: str, target: Path) -> None:
    async with DurableWorker(db_location, SCOPE, ScriptedAdapter(target)) as one, \
            DurableWorker(db_location, SCOPE, ScriptedAdapter(target)) as two:
        async with one.hold_lock():
            with pytest.raises(LockHeld) as info:
                await two.run_cycle()
        assert str(os.getpid()) in info.value.message
        await two.run_cycle()  # released: now it may run


async def test_cancelled_send_is_recorded_uncertain_and_never_resent(
    db_location: str, target: Path
) -> None:
    entered, release = anyio.Event(), threading.Event()
    token = anyio.lowlevel.current_token()

    def script(_w: str) -> str:
        anyio.from_thread.run_sync(entered.set, token=token)
        release.wait(10)
        return "ok"

    adapter = ScriptedAdapter(target, script)
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run_cycle)
            await entered.wait()
            tg.cancel_scope.cancel()
        release.set()
        rec = (await records(worker))["lead-1"]
        assert rec["state"] == "uncertain" and rec["attempts"] == 1
        await worker.run_cycle()
        rec = (await records(worker))["lead-1"]
    assert len(adapter.writes) == 1
    assert rec["state"] in ("confirmed", "uncertain")


async def test_a_page_run_abandoned_by_a_cancel_sends_nothing_more(
    db_location: str, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatch runs a page of records in one worker thread; a cancel abandons the thread
    mid-send.  When that send returns, the thread must stop: no further in-flight mark,
    no further send, even though the rest of its page is still in its hands."""
    from runner.tasks import pagerun

    entered, release, finished = anyio.Event(), threading.Event(), threading.Event()
    token = anyio.lowlevel.current_token()
    run = pagerun.PageRun.run

    def run_and_tell(self: pagerun.PageRun) -> None:
        try:
            run(self)
        finally:
            finished.set()

    monkeypatch.setattr(pagerun.PageRun, "run", run_and_tell)

    def script(write_id: str) -> str:
        if not entered.is_set():
            anyio.from_thread.run_sync(entered.set, token=token)
            release.wait(10)
        return "ok"

    adapter = ScriptedAdapter(target, script)
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        for i in range(3):
            await worker.accept(event(i))
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run_cycle)
            await entered.wait()
            tg.cancel_scope.cancel()
        release.set()  # the abandoned send lands now, after its record was recorded
        assert await anyio.to_thread.run_sync(finished.wait, 10)
        recs = await records(worker)
    assert len(adapter.writes) == 1
    assert recs["lead-0"]["state"] == "uncertain" and recs["lead-0"]["attempts"] == 1
    assert [(recs[k]["state"], recs[k]["attempts"]) for k in ("lead-1", "lead-2")] == [
        ("prepared", 0), ("prepared", 0)]
