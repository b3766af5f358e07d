"""The sweep schedule (C5, M3): aligned to UTC wall-clock multiples, first run at start,
a failing sweep logged and the loop going on.  An injected clock and sleep: no real
waiting; the tests wait on events, bounded by ``fail_after``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.candidates import SweepResult
from runner.candidates.rules import new_candidate
from runner.errors import StoreBusy
from runner.io.stores import open_store
from runner.tasks.sweep import SCHEDULE, next_run, run_sweep_schedule, sweep_background_task
from tests.lifecycle_fixtures import FakeTime

START = datetime(2026, 8, 11, 12, 3, 17, 500000, tzinfo=UTC)


def t(hh: int, mm: int, ss: float = 0) -> datetime:
    return datetime(2026, 8, 11, hh, mm, tzinfo=UTC) + timedelta(seconds=ss)


class FakeSweeper:
    """Records each sweep's ``now``; fails or overruns when told; signals after ``want``."""

    def __init__(self, time: FakeTime, want: int, *, fail: dict[int, Exception] | None = None,
                 takes: dict[int, float] | None = None) -> None:
        self.time, self.want = time, want
        self.fail, self.takes = fail or {}, takes or {}
        self.calls: list[datetime] = []
        self.done = anyio.Event()

    async def sweep_candidates(self, now: datetime) -> SweepResult:
        self.calls.append(now)
        n = len(self.calls)
        self.time.at += timedelta(seconds=self.takes.get(n, 0.25))
        if len(self.calls) >= self.want:
            self.done.set()
        await anyio.lowlevel.checkpoint()
        if n in self.fail:
            raise self.fail[n]
        return {"expired": n, "reconciled": 0}


async def run_until_done(sweeper: FakeSweeper, time: FakeTime, interval: float = 300) -> None:
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: run_sweep_schedule(
                sweeper, time, interval=interval, sleep=time.sleep, task_status=task_status))
            await sweeper.done.wait()
            tg.cancel_scope.cancel()


@pytest.fixture
def sweep_logs() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("runner.sweep")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_schedule_is_declared_as_the_seeds_workflow() -> None:
    assert SCHEDULE.to_json() == {
        "name": "Candidate Lifecycle Sweep", "function": "sweepCandidates",
        "schedule": "*/5 * * * *", "timezone": "UTC", "interval_seconds": 300,
        "mode": "shadow",
    }


@pytest.mark.parametrize(("now", "expected"), [
    (t(12, 3, 17.5), t(12, 5)),
    (t(12, 5), t(12, 10)),                    # strictly after: never the same instant again
    (t(12, 9, 59.999999), t(12, 10)),
    (t(23, 58), datetime(2026, 8, 12, 0, 0, tzinfo=UTC)),
])
def test_next_run_is_the_next_utc_multiple_of_the_interval(now: datetime,
                                                           expected: datetime) -> None:
    assert next_run(now, 300) == expected


def test_next_run_reads_wall_time_in_utc_whatever_the_offset() -> None:
    local = datetime(2026, 8, 11, 15, 3, tzinfo=UTC).astimezone(timezone(timedelta(hours=3)))
    assert next_run(local, 300) == t(15, 5)


@given(
    now=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                     timezones=st.just(UTC)),
    interval=st.sampled_from([0.5, 1, 7, 60, 300, 3600]),
)
def test_next_run_is_aligned_later_and_the_first_such(now: datetime, interval: float) -> None:
    nxt = next_run(now, interval)
    step = timedelta(seconds=interval)
    assert now < nxt <= now + step
    assert (nxt - datetime(1970, 1, 1, tzinfo=UTC)) % step == timedelta(0)


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        next_run(START, 0)


async def test_m3_runs_at_start_then_every_5_minutes_of_utc_wall_time() -> None:
    time = FakeTime(START)
    sweeper = FakeSweeper(time, want=4)
    await run_until_done(sweeper, time)
    assert sweeper.calls[:4] == [START, t(12, 5), t(12, 10), t(12, 15)]
    assert time.sleeps[:3] == pytest.approx([102.25, 299.75, 299.75])


async def test_a_failing_sweep_is_logged_and_the_loop_goes_on(
    sweep_logs: list[logging.LogRecord]
) -> None:
    time = FakeTime(START)
    sweeper = FakeSweeper(time, want=5, fail={   # the 5th run ends the test: 4 complete
        1: StoreBusy("store stayed locked while sweeping"), 2: RuntimeError("boom")})
    await run_until_done(sweeper, time)
    assert sweeper.calls[:4] == [START, t(12, 5), t(12, 10), t(12, 15)]
    actions = [(r.action, getattr(r, "error", None)) for r in sweep_logs][:4]  # type: ignore[attr-defined]
    assert actions == [("sweep.failed", "StoreBusy"), ("sweep.failed", "RuntimeError"),
                       ("sweep.done", None), ("sweep.done", None)]
    assert sweep_logs[0].levelno == logging.ERROR and "locked" in sweep_logs[0].getMessage()


async def test_an_overrun_is_followed_by_one_late_run_not_a_burst() -> None:
    time = FakeTime(START)
    sweeper = FakeSweeper(time, want=3, takes={1: 12 * 60})   # the first sweep takes 12 min
    await run_until_done(sweeper, time)
    assert sweeper.calls[:3] == [START, START + timedelta(minutes=12), t(12, 20)]


class JumpingTime(FakeTime):
    """A wall clock that jumps by ``jump`` during the first sleep (a clock set back or
    forward, or a suspend the monotonic sleep did not count)."""

    def __init__(self, moment: datetime, jump: timedelta) -> None:
        super().__init__(moment)
        self.jump: timedelta | None = jump

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        if self.jump is not None:
            self.at += self.jump
            self.jump = None


async def test_a_clock_set_back_an_hour_delays_the_next_sweep_by_at_most_one_interval() -> None:
    time = JumpingTime(START, timedelta(hours=-1))
    sweeper = FakeSweeper(time, want=3)
    await run_until_done(sweeper, time)
    # after the jump the wall clock reads 11:05; the next run is at 11:10, not at 12:05
    assert sweeper.calls[:3] == [START, t(11, 10), t(11, 15)]
    assert max(time.sleeps) <= 300


async def test_a_suspend_or_a_jump_ahead_gives_one_late_sweep_then_the_schedule() -> None:
    time = JumpingTime(START, timedelta(hours=3))
    sweeper = FakeSweeper(time, want=3)
    await run_until_done(sweeper, time)
    # three hours passed unseen: one sweep at once (not 36 catch-up runs), then aligned
    assert sweeper.calls[:3] == [START, t(15, 5), t(15, 10)]


async def test_sub_second_intervals_align_too() -> None:
    time = FakeTime(t(12, 0, 0.1))
    sweeper = FakeSweeper(time, want=3, takes={1: 0, 2: 0, 3: 0})
    await run_until_done(sweeper, time, interval=0.5)
    assert sweeper.calls[:3] == [t(12, 0, 0.1), t(12, 0, 0.5), t(12, 0, 1.0)]


async def test_it_is_started_before_the_first_sweep_and_ends_only_by_cancellation() -> None:
    time = FakeTime(START)
    gate = anyio.Event()

    class Hanging:
        async def sweep_candidates(self, now: datetime) -> SweepResult:
            gate.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: run_sweep_schedule(
                Hanging(), time, sleep=time.sleep, task_status=task_status))
            await gate.wait()          # started() came first; the sweep is now hanging
            tg.cancel_scope.cancel()   # a hung sweep is still cancellable
    assert tg.cancel_scope.cancel_called


async def test_a_sweep_that_always_fails_never_stops_its_sibling_tasks(
    sweep_logs: list[logging.LogRecord]
) -> None:
    """Shadow mode in a task group: the lead cycle (a stand-in here) runs to its end while
    every sweep fails; the group is never cancelled by the sweep."""
    time = FakeTime(START)
    sweeper = FakeSweeper(time, want=10**9, fail={n: RuntimeError("down") for n in
                                                  range(1, 1000)})
    cycles: list[int] = []

    async def lead_cycle_stand_in() -> None:
        for cycle in range(20):
            cycles.append(cycle)
            await time.sleep(60)        # one "cycle" a minute on the same fake time

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: run_sweep_schedule(
                sweeper, time, interval=300, sleep=time.sleep, task_status=task_status))
            await lead_cycle_stand_in()
            tg.cancel_scope.cancel()
    assert cycles == list(range(20))
    assert len(sweeper.calls) >= 4          # 20 minutes: at start, then every 5 minutes
    assert {r.action for r in sweep_logs} == {"sweep.failed"}  # type: ignore[attr-defined]


async def test_the_background_task_sweeps_its_store_on_a_connection_of_its_own(
    db_location: str
) -> None:
    """What ``start`` runs in its task group: ``(name, task)`` over the store at ``db``."""
    async with await open_store(db_location) as store:
        await store.add_candidate(new_candidate("c1", START - timedelta(hours=1)))
    time = FakeTime(START)
    waited = anyio.Event()

    async def sleep(seconds: float) -> None:       # the first sweep has committed by now
        waited.set()
        await time.sleep(seconds)

    name, task = sweep_background_task(functools.partial(open_store, db_location), clock=time,
                                       sleep=sleep)
    assert name == "Candidate Lifecycle Sweep"
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
            await waited.wait()
            tg.cancel_scope.cancel()
    async with await open_store(db_location) as store:
        last = await store.last_sweep()
    assert last is not None and (last.at, last.result) == (START, {"expired": 1,
                                                                   "reconciled": 0})
    with pytest.raises(ValueError, match="positive"):
        sweep_background_task(functools.partial(open_store, db_location), interval=0)
