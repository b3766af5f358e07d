"""Time that goes backwards (a ``--now`` jump, a host clock corrected after running
ahead): a time in the store after ``now`` counts as ``now``, so nothing starves.

* polls: a poll time after ``now`` is moved back to ``now`` by the next pass, so the
  records polled "in the future" take their turn again, oldest poll first;
* claims and retries: a lease or retry time further ahead than any runner sets
  (``CLOCK_HORIZON_MS``) was written by a clock that ran ahead and is due now;
* candidates: nothing is analyzed or promoted before its creation time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.clock import FixedClock
from runner.errors import RuleViolation
from runner.io.synthetic_target import SyntheticTarget
from runner.lifecycle import rules
from runner.models import Scope
from runner.pipeline.engine import default_registry
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.jobs import run_job
from runner.pipeline.model import CLOCK_HORIZON_MS
from runner.store import Store
from tests.helpers import SCOPE, event
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
            polled_since |= {r["source_lead_id"] for r in (await worker.status())["records"]
                             if r["last_polled_at"] == _text(clock.at)}
        records = (await worker.status())["records"]
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
