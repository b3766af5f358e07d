"""Time that goes backwards (a ``--now`` jump, a host clock corrected after running
ahead): a time in the store after ``now`` counts as ``now``, so nothing starves.

* polls: a poll time after ``now`` is moved back to ``now`` by the next pass, so the
  records polled "in the future" take their turn again, oldest poll first;
* claims and retries: a lease or retry time further ahead than any runner sets
  (``CLOCK_HORIZON_MS``) was written by a clock that ran ahead and is due now;
* candidates: nothing is analyzed or promoted before its creation time.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from runner import DurableWorker
from runner.candidates import rules
from runner.clock import FixedClock
from runner.errors import RuleViolation
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import Scope
from runner.loop import LoopSettings, run
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.jobs import run_job
from runner.pipeline.model import CLOCK_HORIZON_MS
from runner.pipeline.plugins import default_registry
from runner.store import Store
from runner.tasks.outcomes import CycleSummary
from tests.fakes import ScriptedAdapter
from tests.helpers import SCOPE, event, worker_records
from tests.pipeline_fixtures import NOW, lead_history

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def test_records_polled_in_the_future_are_polled_again_after_the_clock_goes_back(
    db_location: str, workdir: Path
) -> None:
    clock = FixedClock(T0)
    target = SyntheticTarget(str(workdir / "target.db"))
    async with DurableWorker(db_location, SCOPE, target, clock=clock) as worker:
        for i in range(30):
            await worker.accept(event(i))
        assert (await worker.run_cycle()).confirmed == 30
        for _ in range(3):  # every record polled once at T0
            assert (await worker.poll(10)).polled == 10
        clock.at = T0 + timedelta(days=1)  # forward...
        assert (await worker.poll(10)).polled == 10
        back = T0 + timedelta(seconds=1)  # ...and back
        polled_since: set[str] = set()
        for step in range(3):
            clock.at = back + timedelta(seconds=step)
            await worker.poll(10)
            polled_since |= {r["source_lead_id"] for r in await worker_records(worker)
                             if r["last_polled_at"] == _text(clock.at)}
        records = await worker_records(worker)
    target.close()
    assert polled_since == {f"lead-{i}" for i in range(30)}  # nobody starved
    assert max(r["last_polled_at"] for r in records) <= _text(back + timedelta(seconds=2))


def _text(at: datetime) -> str:
    from runner.clock import to_text

    return to_text(at)


async def test_a_claim_taken_by_a_clock_far_ahead_is_due_now(store: Store, scope: Scope) -> None:
    await lead_history(store, scope, 3)
    await run_job(store, "backfill", registry=default_registry(), clock=FixedClock(NOW))
    now_ms = int(NOW.timestamp() * 1000)
    await store.register_processors([LeadFacts.ref], now_ms)
    ahead = await store.claim(LeadFacts.ref, "ahead", 10, 30_000, now_ms + 2 * CLOCK_HORIZON_MS)
    assert len(ahead.items) == 3  # a worker whose clock ran far ahead took them, then died
    taken = await store.claim(LeadFacts.ref, "now", 10, 30_000, now_ms)
    assert len(taken.items) == 3 and taken.token > ahead.token
    # a lease within the horizon is a lease: the new holder keeps its claim
    assert (await store.claim(LeadFacts.ref, "other", 10, 30_000, now_ms + 1000)).items == ()


def test_nothing_happens_to_a_candidate_before_its_creation() -> None:
    candidate = rules.new_candidate("c1", T0)
    earlier = T0 - timedelta(minutes=1)
    for refusal in (rules.analysis_refusal(candidate, "c1", "a1", earlier),
                    rules.promotion_refusal(candidate, "c1", earlier)):
        assert isinstance(refusal, RuleViolation) and refusal.reason == "before_creation"
    assert rules.analysis_refusal(candidate, "c1", "a1", T0) is None


async def test_the_store_refuses_an_analysis_or_promotion_before_creation(
    store: Store
) -> None:
    await store.add_candidate(rules.new_candidate("c1", T0, quorum=1))
    with pytest.raises(RuleViolation) as info:
        await store.analyze_candidate("c1", "a1", T0 - timedelta(seconds=1))
    assert info.value.reason == "before_creation"
    await store.analyze_candidate("c1", "a1", T0)
    with pytest.raises(RuleViolation) as info:
        await store.begin_promotion("c1", T0 - timedelta(seconds=1))
    assert info.value.reason == "before_creation"
    assert (await store.begin_promotion("c1", T0)).status.value == "promoting"


# -- the lead loop's schedule: the monotonic clock ---------------------------------------


class SteppedLoop(asyncio.SelectorEventLoop):
    """An event loop whose monotonic clock a test moves on (as a suspend would, on a
    clock that counts it): every timer due by then fires at once."""

    offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


def test_the_lead_loop_waits_on_the_monotonic_clock_and_a_jump_ahead_is_one_cycle(
        workdir: Path) -> None:
    loops: list[SteppedLoop] = []

    def make_loop() -> SteppedLoop:
        loops.append(SteppedLoop())
        return loops[-1]

    summaries: list[CycleSummary] = []
    after: list[int] = []

    async def main() -> int:
        cycled = [anyio.Event(), anyio.Event()]

        def emit(summary: CycleSummary) -> None:
            summaries.append(summary)
            if len(summaries) <= 2:
                cycled[len(summaries) - 1].set()

        async def jumper() -> None:
            await cycled[0].wait()  # the loop now waits its 60 s interval
            loops[0].offset += 3600  # an hour passes unseen
            await cycled[1].wait()  # the wait ended: one cycle
            await anyio.sleep(0.5)  # an observation window: no catch-up burst follows
            after.append(len(summaries))
            loops[0].offset += 60  # the next interval passes: the last cycle

        async with DurableWorker(str(workdir / "q.db"), SCOPE,
                                 ScriptedAdapter(workdir / "t.db")) as worker:
            await worker.accept(event(1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(jumper)
                return await run(worker, LoopSettings(cycles=3, interval=60), emit)

    code = anyio.run(main, backend_options={"loop_factory": make_loop})
    assert code == 0
    assert after == [2]
    assert [s.confirmed for s in summaries] == [1, 0, 0]


async def test_the_wall_clock_set_back_a_day_neither_stalls_nor_repeats_the_cycles(
        workdir: Path, db_location: str) -> None:
    clock = FixedClock(T0)
    summaries: list[CycleSummary] = []

    def emit(summary: CycleSummary) -> None:
        summaries.append(summary)
        clock.at -= timedelta(days=1)  # between cycles, the host clock goes back a day

    adapter = ScriptedAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock) as worker:
        await worker.accept(event(1))
        with anyio.fail_after(60):
            code = await run(worker, LoopSettings(cycles=3, interval=0.01), emit)
    assert code == 0
    assert [s.confirmed for s in summaries] == [1, 0, 0]
    assert [s.polled for s in summaries] == [1, 1, 1]  # polled "in the future": again
    assert len(adapter.writes) == 1
