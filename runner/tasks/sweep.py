"""The candidate lifecycle sweep on its schedule (SPEC C5; seed ``001_*``, M3).

Declared as data, the way the seed's workflow file declares it, so ``status`` can show
it: ``Candidate Lifecycle Sweep`` runs ``sweepCandidates`` every 5 minutes of UTC wall
time, in *shadow* mode (additive and non-blocking).

Why a loop of its own: ``start`` runs :func:`run_sweep_schedule` as its own task in its
task group, so a slow, hung or failing sweep never delays the lead cycle.  Shadow mode
means a failing sweep is logged (logger ``runner.sweep``, action ``sweep.failed``) and the
loop goes on to the next run; only cancellation ends it.  Give it a store of its own (its
own connection) so a long sweep never holds the connection the lead cycle uses.

Runs are aligned to UTC wall-clock multiples of the interval (12:00, 12:05, …), not to
"5 minutes after the last run", so every process agrees on when a sweep is due.  The
first run is at start.  A run that overruns one or more boundaries is followed by one
late run at once, never by a burst of catch-up runs.  Time comes from the injected clock
and waiting from the injected ``sleep``, so tests never really sleep.

A lost store (``StoreUnavailable``: a PostgreSQL restart or failover, issue 30) is the one
failure shadow mode does not swallow: the task reconnects its store with the run's
backoff (``runner.tasks.reconnect``) and runs the sweep that failed again at once.  Each
step of a sweep commits with its audit events, so a sweep cut in the middle and run
again moves every candidate once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NoReturn

import anyio
from anyio.abc import TaskStatus

from runner.candidates.port import CandidateSweeper
from runner.candidates.results import SCHEDULE, SweepResult
from runner.clock import Clock, SystemClock
from runner.errors import StoreUnavailable

if TYPE_CHECKING:
    from runner.store import Store
    from runner.tasks.reconnect import ReconnectPolicy

log = logging.getLogger("runner.sweep")

Sleep = Callable[[float], Awaitable[None]]
#: opens a store connection of the task's own (the edge binds the location)
StoreOpener = Callable[[], Awaitable["Store"]]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


DEFAULT_INTERVAL = SCHEDULE.interval_seconds


def next_run(now: datetime, interval: float) -> datetime:
    """The first UTC wall-clock multiple of ``interval`` seconds strictly after ``now``.

    Computed in whole microseconds (no float rounding): with 300 s, 12:03:17 -> 12:05:00
    and 12:05:00 -> 12:10:00.
    """
    step = round(interval * 1_000_000)
    if step <= 0:
        raise ValueError("the sweep interval must be positive")
    elapsed = (now.astimezone(UTC) - _EPOCH) // _MICROSECOND
    return _EPOCH + (elapsed // step + 1) * step * _MICROSECOND


async def sweep_once(store: CandidateSweeper, now: datetime) -> SweepResult | None:
    """Run sweepCandidates once; a failure is logged and answered with None (shadow)."""
    try:
        result = await store.sweep_candidates(now)
    except StoreUnavailable:
        raise  # the store's session is gone: the task reconnects and sweeps again
    except Exception as exc:  # noqa: BLE001 - shadow mode: a failing sweep never stops the loop
        log.error("%s failed: %s", SCHEDULE.function, exc,
                  extra={"action": "sweep.failed", "task": SCHEDULE.function,
                         "error": type(exc).__name__})
        return None
    log.info("%s: expired=%d reconciled=%d", SCHEDULE.function,
             result["expired"], result["reconciled"],
             extra={"action": "sweep.done", "task": SCHEDULE.function,
                    "count": result["expired"] + result["reconciled"]})
    return result


async def sleep_until(target: datetime, clock: Clock, sleep: Sleep, interval: float) -> None:
    """Wait until the clock reads ``target``: sleeping (on the monotonic clock) and reading
    the wall clock again after each sleep.

    The wall clock may move under a sleep.  Forward (a jump, or a suspend that the
    monotonic sleep did not count): the target has passed, the wait ends, and one late run
    follows, never a burst.  Back (more than ``interval`` left): the target is aligned
    again from the clock's new time, so a clock set back an hour delays the next run by at
    most one interval, never by the hour."""
    while (remaining := (target - clock.now()).total_seconds()) > 0:
        if remaining > interval:
            target = next_run(clock.now(), interval)
            continue
        await sleep(remaining)


async def run_sweep_schedule(
    store: CandidateSweeper,
    clock: Clock,
    *,
    interval: float = DEFAULT_INTERVAL,
    sleep: Sleep = anyio.sleep,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Run sweepCandidates at start, then at every UTC multiple of ``interval`` seconds.

    Never returns; never raises except on cancellation.  ``task_status.started()`` is
    called before the first run, so ``await tg.start(run_sweep_schedule, …)`` does not
    wait for a sweep.
    """
    next_run(clock.now(), interval)  # refuse a bad interval before reporting started
    task_status.started()
    while True:
        started = clock.now()
        await sweep_once(store, started)
        await sleep_until(next_run(started, interval), clock, sleep, interval)


def sweep_background_task(
    open_store: StoreOpener,
    *,
    interval: float = DEFAULT_INTERVAL,
    clock: Clock | None = None,
    sleep: Sleep = anyio.sleep,
    reconnect: ReconnectPolicy | None = None,
) -> tuple[str, Callable[[], Awaitable[None]]]:
    """``(name, task)`` for the worker loop's background tasks: the schedule over a store
    connection of its own (``open_store()`` opens it), so a long sweep never holds the
    lead cycle's connection.  With ``reconnect``, a lost store is reconnected and the
    schedule goes on (its sweep run again at once)."""
    next_run(datetime.now(UTC), interval)  # refuse a bad interval when the task is built

    async def task() -> None:
        from runner.tasks.reconnect import NEVER, riding_through

        # the task ends by cancellation: the store's close shields itself
        async with await open_store() as store:
            await riding_through(
                store, lambda: run_sweep_schedule(store, clock or SystemClock(),
                                                  interval=interval, sleep=sleep),
                reconnect or NEVER, what=SCHEDULE.name)

    return SCHEDULE.name, task
