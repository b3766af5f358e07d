"""I/O error countdown (issue 8.4): the store fails its 1st, 2nd, … operation until a
whole accept-and-cycle completes.  After each failure the store keeps every invariant,
and a clean rerun finishes the work without a second send."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from harness.invariants import audit
from runner import DurableWorker
from runner.io.stores import open_store
from runner.leads.models import CRMRecord
from runner.leads.port import AmbiguousWriteError, BeforeWriteError
from tests.fakes import ScriptedAdapter
from tests.faultstore import CountdownStore, InjectedIOError, attach
from tests.helpers import SCOPE, event

KEYS = [f"lead-{i}" for i in range(4)]


class Target(ScriptedAdapter):
    """lead-1's first send times out after writing; lead-2's first send never leaves."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: Counter[str] = Counter()
        self.left: Counter[str] = Counter()  # sends that left (reached the sheet)

    def write(self, record: CRMRecord, write_id: str) -> None:
        key = record.source_lead_id
        self.calls[key] += 1
        if key == "lead-2" and self.calls[key] == 1:
            raise BeforeWriteError("outage: not sent")
        self.left[key] += 1
        self.sheet.write(record, write_id)
        if key == "lead-1" and self.calls[key] == 1:
            raise AmbiguousWriteError("timed out after the write")


async def accept_and_deliver(worker: DurableWorker, acked: set[str]) -> None:
    for i, key in enumerate(KEYS):
        result = await worker.accept(event(i))
        assert result.ok
        acked.add(key)
    await worker.run_cycle()  # lead-1 uncertain, lead-2 failed_safe, others confirmed
    await worker.run_cycle()  # lead-1 confirmed by readback, lead-2 sent again
    await worker.poll(10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["before", "after"])
async def test_countdown_until_a_whole_run_completes(
    tmp_path: Path, new_location: Callable[[str], str], when: Literal["before", "after"]
) -> None:
    """On every backend: the wrapper is around the Store port, whatever its adapter."""
    failures: list[str] = []
    for n in range(1, 200):
        work = tmp_path / f"{when}-{n}"
        work.mkdir(mode=0o700)
        db, target = new_location(f"q{n}"), Target(work / "t.db")
        acked: set[str] = set()
        worker = DurableWorker(db, SCOPE, target, retry_base=0)  # lead-2 due at once
        store = CountdownStore(await open_store(db, scope=worker.scope), n, when)
        attach(worker, store)  # the library, over a failing store
        try:
            async with worker:
                await accept_and_deliver(worker, acked)
        except InjectedIOError:
            assert store.failed is not None
            failures.append(store.failed)
        else:
            assert store.failed is None
            break
        after_failure = audit(db, work / "t.db", accepted=acked, in_flight_ok=True)
        assert after_failure.ok, (n, store.failed, after_failure.violations)
        async with DurableWorker(db, SCOPE, target, retry_base=0) as clean:  # the clean rerun
            await accept_and_deliver(clean, acked)
            await clean.run_cycle()
        final = audit(db, work / "t.db", accepted=KEYS, in_flight_ok=False)
        assert final.ok, (n, store.failed, final.violations)
        assert all(sent == 1 for sent in target.left.values()), (n, target.left)
        assert not final.states["prepared"] and not final.states["failed_safe"]
        # uncertain only where nothing was ever written: the readback found no row
        assert final.states["uncertain"] == sum(1 for k in KEYS if not final.rows[k])
    else:
        pytest.fail("the run never completed")
    assert n > 20 and len(failures) == n - 1
    assert {"accept_many", "finish_and_mark", "finish_send", "record_reconcile_batch",
            "recover_in_flight", "record_poll_pass"} <= set(failures), failures


async def test_an_outcome_committed_with_the_next_mark_is_not_recorded_again(
    tmp_path: Path,
) -> None:
    """Found by this countdown after the two-commits-per-send change: when the statement
    that commits one outcome and the next in-flight mark committed but then failed (or
    was cancelled while SQLite finished it), the cycle's way out tried to record that
    outcome again, raised IllegalTransition and hid the real error (exit 70)."""
    work = tmp_path / "w"
    work.mkdir(mode=0o700)
    target = Target(work / "t.db")
    async with DurableWorker(str(work / "q.db"), SCOPE, target) as worker:
        for i in range(3):
            await worker.accept(event(i))
    worker = DurableWorker(str(work / "q.db"), SCOPE, target)
    inner = await open_store(str(work / "q.db"), scope=worker.scope)
    store = CountdownStore(inner, 2, "after", only="finish_and_mark")  # lead-0 out, lead-1 in
    attach(worker, store)
    async with worker:
        with pytest.raises(InjectedIOError):
            await worker.run_cycle()
    assert store.failed == "finish_and_mark"
    final = audit(work / "q.db", work / "t.db", accepted=["lead-0"], in_flight_ok=True)
    assert final.ok and final.states["confirmed"] == 1 and final.states["in_flight"] == 1
