"""Claims and leases on every backend (issue 7 points 3, 4; SPEC P4): fencing tokens,
expiry, renewal of a slow batch, a refused stale completion that writes nothing."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from runner.clock import SystemClock
from runner.io.stores import open_store
from runner.leads.models import Scope
from runner.pipeline.engine import (
    Processor,
    WorkerSettings,
    completions,
    now_ms,
    run_round,
)
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.jobs import run_job
from runner.pipeline.model import Claim, Item, LeaseLost, Outcome
from runner.pipeline.plugins import default_registry
from runner.store import Store
from tests.pipeline_fixtures import NOW, lead_history, level, query

pytestmark = pytest.mark.timeout(60)
REF = LeadFacts.ref
T0 = 1_700_000_000_000  # epoch ms, before the real now (the slow test uses the system clock)
LEASE = 30_000


async def _inputs(store: Store, scope: Scope, n: int) -> None:
    from runner.clock import FixedClock

    await lead_history(store, scope, n)
    await run_job(store, "backfill", registry=default_registry(), clock=FixedClock(NOW))
    await store.register_processors([REF], T0)


async def _process(claim: Claim) -> list[Outcome]:
    return list(await LeadFacts().process(claim.items))


async def test_a_completion_with_a_stale_fencing_token_is_refused_and_writes_nothing(
    store: Store, scope: Scope, db_location: str
) -> None:
    await _inputs(store, scope, 5)
    first = await store.claim(REF, "worker-a", 10, LEASE, T0)
    assert len(first.items) == 5
    assert (await store.claim(REF, "worker-b", 10, LEASE, T0 + 1000)).items == ()  # held
    later = T0 + LEASE + 1
    second = await store.claim(REF, "worker-b", 10, LEASE, later)  # the lease ran out
    assert [i.input_id for i in second.items] == [i.input_id for i in first.items]
    assert second.token > first.token
    done = completions(first, await _process(first), WorkerSettings().retry, later)
    with pytest.raises(LeaseLost):
        await store.complete(first, done, later)
    with pytest.raises(LeaseLost):
        await store.renew(first, LEASE, later)
    assert await level(store, 2) == {}
    assert query(db_location, "SELECT DISTINCT state, owner FROM pipeline_work") == [
        ("claimed", "worker-b")]
    await store.complete(second, completions(second, await _process(second),
                                             WorkerSettings().retry, later), later)
    assert len(await level(store, 2)) == 5
    assert query(db_location, "SELECT count(*) FROM pipeline_outcome_history") == [(0,)]


async def test_a_completion_after_the_lease_ran_out_is_refused_even_if_nobody_claimed(
    store: Store, scope: Scope
) -> None:
    await _inputs(store, scope, 2)
    claim = await store.claim(REF, "worker-a", 10, LEASE, T0)
    done = completions(claim, await _process(claim), WorkerSettings().retry, T0)
    with pytest.raises(LeaseLost):
        await store.complete(claim, done, T0 + LEASE + 1)
    assert await level(store, 2) == {}
    await store.complete(claim, done, T0 + LEASE)  # at the instant it is still ours
    assert len(await level(store, 2)) == 2


async def test_renewal_extends_the_lease_of_the_whole_batch(
    store: Store, scope: Scope
) -> None:
    await _inputs(store, scope, 3)
    claim = await store.claim(REF, "worker-a", 10, LEASE, T0)
    expires = await store.renew(claim, LEASE, T0 + LEASE - 1)
    assert expires == T0 + 2 * LEASE - 1
    assert (await store.claim(REF, "worker-b", 10, LEASE, T0 + LEASE + 5)).items == ()
    assert len((await store.claim(REF, "worker-b", 10, LEASE, expires + 1)).items) == 3


async def test_claims_are_disjoint(store: Store, scope: Scope, db_location: str) -> None:
    await _inputs(store, scope, 20)
    async with await open_store(db_location) as other:
        seen: list[int] = []
        for i in range(4):
            mine = await (store if i % 2 else other).claim(REF, f"w{i}", 5, LEASE, T0)
            seen += [item.input_id for item in mine.items]
        assert (await store.claim(REF, "w9", 5, LEASE, T0)).items == ()
    assert len(seen) == len(set(seen)) == 20


class _Slow(Processor):
    """Takes 2.5 leases, and meanwhile checks that nobody else can claim its inputs."""

    ref = REF

    def __init__(self, other: Store, settings: WorkerSettings) -> None:
        self.other, self.settings = other, settings
        self.competitor_got: list[int] = []

    async def process(self, items: Sequence[Item]) -> Sequence[Outcome]:
        for _ in range(5):  # 5 x half a lease: past the first expiry twice over
            await anyio.sleep(self.settings.lease_seconds / 2)
        took = await self.other.claim(REF, "competitor", 100, self.settings.lease_ms,
                                      now_ms(SystemClock()))
        self.competitor_got.append(len(took.items))
        return await LeadFacts().process(items)


async def test_a_processor_slower_than_its_lease_keeps_its_claim_by_renewal(
    store: Store, scope: Scope, db_location: str
) -> None:
    await _inputs(store, scope, 3)
    settings = WorkerSettings(lease_seconds=0.4)
    async with await open_store(db_location) as other:
        slow = _Slow(other, settings)
        result = await run_round(store, slow, "slow-worker", settings, SystemClock())
    assert slow.competitor_got == [0]
    assert result.claimed == 3 and not result.refused and result.outcomes == {"output": 3}
    assert len(await level(store, 2)) == 3


class _Stuck(Processor):
    ref = REF

    def __init__(self) -> None:
        self.started = anyio.Event()

    async def process(self, items: Sequence[Item]) -> Sequence[Outcome]:
        self.started.set()
        await anyio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_cancelled_round_gives_its_batch_back(store: Store, scope: Scope) -> None:
    await _inputs(store, scope, 4)
    stuck = _Stuck()
    clock = SystemClock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_round, store, stuck, "stopping-worker", WorkerSettings(), clock)
        with anyio.fail_after(10):
            await stuck.started.wait()
        tg.cancel_scope.cancel()
    again = await store.claim(REF, "next-worker", 10, LEASE, now_ms(clock))
    assert len(again.items) == 4  # at once, not after the 30 s lease
    assert {i.attempts for i in again.items} == {2}


class _SlowBlocking(Processor):
    """A plain blocking ``process_one``, slower per batch than the lease."""

    ref = REF

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def process_one(self, item: Item) -> Outcome:
        import time

        time.sleep(self.seconds)  # blocking work: the thread, not the loop, waits
        return LeadFacts().process_one(item)


async def test_a_blocking_processor_slower_than_its_lease_drains_the_backlog(
    store: Store, scope: Scope
) -> None:
    await _inputs(store, scope, 6)
    # a lease long enough that a loaded machine still renews it in time (it is renewed
    # every third of it), a batch well past it
    settings = WorkerSettings(lease_seconds=1.0, batch_size=2)
    slow = _SlowBlocking(0.75)  # 1.5 s per batch of 2: past the 1 s lease
    rounds = []
    with anyio.fail_after(30):
        while True:
            result = await run_round(store, slow, "blocking-worker", settings, SystemClock())
            if not result.claimed:
                break
            rounds.append(result)
    assert [(r.claimed, r.refused, r.outcomes) for r in rounds] == [
        (2, False, {"output": 2})] * 3
    assert len(await level(store, 2)) == 6
