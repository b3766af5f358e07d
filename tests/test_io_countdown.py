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
from runner.tasks.outcomes import CycleSummary
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


#: the countdown's failure points are dealt to this many tests per backend and mode, so
#: that parallel test processes share one countdown (n = shard+1, shard+1+SHARDS, …)
SHARDS = 3
#: operations every whole run makes (so every one of them is failed somewhere)
#: on PostgreSQL, a shard fails every this many of its failure points
PG_STRIDE = 3
MUST_FAIL = {"accept_many", "finish_and_mark", "finish_send", "record_reconcile_batch",
             "recover_in_flight", "record_poll_pass"}


async def _run(tmp_path: Path, new_location: Callable[[str], str], name: str, n: int,
               when: Literal["before", "after"]) -> tuple[CountdownStore, str, Path,
                                                          Target, set[str]]:
    """A whole accept-and-cycle over a store that fails its ``n``th operation (0: none)."""
    work = tmp_path / name
    work.mkdir(mode=0o700)
    db, target = new_location(f"q{name.replace('-', '')}"), Target(work / "t.db")
    acked: set[str] = set()
    worker = DurableWorker(db, SCOPE, target, retry_base=0)  # lead-2 due at once
    store = CountdownStore(await open_store(db, scope=worker.scope), n, when)
    attach(worker, store)  # the library, over a failing store
    try:
        async with worker:
            await accept_and_deliver(worker, acked)
    except InjectedIOError:
        assert n and store.failed is not None
    else:
        assert store.failed is None
    return store, db, work, target, acked


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("when", ["before", "after"])
async def test_countdown_until_a_whole_run_completes(
    tmp_path: Path, new_location: Callable[[str], str], when: Literal["before", "after"],
    shard: int, backend: str,
) -> None:
    """On every backend: the wrapper is around the Store port, whatever its adapter.

    A run over a store that never fails lists the operations a whole run makes, in order;
    then the run is repeated with its 1st, 2nd, … operation failing (this shard's share of
    them), and each repetition fails exactly at that operation."""
    clean, db, work, _, _ = await _run(tmp_path, new_location, "whole", 0, when)
    ops = clean.names
    whole = audit(db, work / "t.db", accepted=KEYS, in_flight_ok=False)
    assert whole.ok and whole.states["confirmed"] == len(KEYS), whole.violations
    assert len(ops) > 20 and set(ops) >= MUST_FAIL, ops
    # on PostgreSQL (the slow tier) every third failure point of the shard's share, a
    # third of the cost of fresh schemas (the CI budget); on SQLite every one
    stride = SHARDS * (PG_STRIDE if backend == "postgres" else 1)
    failed: set[str] = set()
    for n in range(shard + 1, len(ops) + 1, stride):
        store, db, work, target, acked = await _run(tmp_path, new_location, f"{when}-{n}",
                                                    n, when)
        assert store.failed == ops[n - 1], (n, store.failed, ops[n - 1])
        failed.add(ops[n - 1])
        after_failure = audit(db, work / "t.db", accepted=acked, in_flight_ok=True)
        assert after_failure.ok, (n, store.failed, after_failure.violations)
        async with DurableWorker(db, SCOPE, target, retry_base=0) as clean_rerun:
            await accept_and_deliver(clean_rerun, acked)
            await clean_rerun.run_cycle()
        final = audit(db, work / "t.db", accepted=KEYS, in_flight_ok=False)
        assert final.ok, (n, store.failed, final.violations)
        assert all(sent == 1 for sent in target.left.values()), (n, target.left)
        assert not final.states["prepared"] and not final.states["failed_safe"]
        # uncertain only where nothing was ever written: the readback found no row
        assert final.states["uncertain"] == sum(1 for k in KEYS if not final.rows[k])
    assert failed, ops


async def test_an_outcome_committed_with_the_next_mark_is_not_recorded_again(
    tmp_path: Path,
) -> None:
    """Found by this countdown after the two-commits-per-send change: when the statement
    that commits one outcome and the next in-flight mark committed but then failed (or
    was cancelled while SQLite finished it), the cycle's way out tried to record that
    outcome again, raised IllegalTransition and hid the real error (exit 70).  The
    cycle's summary counts the outcome the store holds (a ride-through prints it)."""
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
    summary = CycleSummary()
    async with worker:
        with pytest.raises(InjectedIOError):
            await worker.run_cycle(summary=summary)
    assert store.failed == "finish_and_mark"
    assert (summary.dispatched, summary.confirmed) == (1, 1)
    final = audit(work / "q.db", work / "t.db", accepted=["lead-0"], in_flight_ok=True)
    assert final.ok and final.states["confirmed"] == 1 and final.states["in_flight"] == 1
