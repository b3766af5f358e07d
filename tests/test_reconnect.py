"""Waiting out a lost store (issue 30, ``runner.tasks.reconnect``), in process: the
backoff's bounds, one attempt series (what it logs, when it gives up, what it never
retries), a stop in the middle, and work started over after a reconnect.  The real
losses (a killed server, terminated sessions, a cut network path) are in
tests/test_ride_through.py and tests/test_failover.py."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import pytest

from runner.errors import (
    ConfigMismatch,
    LockHeld,
    LockLost,
    StoreError,
    StoreUnavailable,
    TargetAbsent,
    TargetUnavailable,
)
from runner.tasks import reconnect
from runner.tasks.reconnect import ReconnectPolicy, is_lost, riding_through, wait_out

pytestmark = pytest.mark.timeout(30)

LOST = StoreUnavailable("lost the connection to PostgreSQL at h:5432/db: gone")
QUICK = ReconnectPolicy(limit=5.0, first=0.001, cap=0.004)


def test_the_delay_doubles_up_to_its_cap_and_is_drawn_from_its_upper_half() -> None:
    policy = ReconnectPolicy()
    assert [policy.delay(n, draw=lambda: 1.0) for n in range(7)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert [policy.delay(n, draw=lambda: 0.0) for n in range(7)] == [
        0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay(10**6, draw=lambda: 1.0) == 2.0  # no overflow, ever
    assert reconnect.DEFAULT_RECONNECT_MAX == policy.limit == 300.0
    assert not reconnect.NEVER.enabled and policy.enabled


def test_only_a_lost_session_is_a_loss_to_wait_out() -> None:
    assert is_lost(LOST) and is_lost(LockLost("the lock's session ended"))
    assert is_lost(ExceptionGroup("lanes", [LOST, StoreUnavailable("again")]))
    assert not is_lost(ExceptionGroup("lanes", [LOST, ValueError("a bug")]))
    for other in (StoreError("corrupt"), ConfigMismatch("scope"), LockHeld("held"),
                  TargetUnavailable("target down"), ValueError("bug")):
        assert not is_lost(other)


class Attempts:
    """An attempt that fails with ``failures`` in turn, then answers ``result``."""

    def __init__(self, *failures: BaseException, result: str = "back") -> None:
        self.failures = list(failures)
        self.result = result
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.result


def actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(r, "action", "") for r in caplog.records if r.name == "runner.reconnect"
            and r.levelno >= logging.INFO]


async def test_a_series_is_one_warning_then_one_line_when_it_is_over(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="runner.reconnect")
    attempt = Attempts(LOST, LOST, LOST, TargetUnavailable("the table is on that server"))
    pings: list[int] = []
    assert await wait_out("start", attempt, QUICK, first_error=LOST,
                          alive=lambda: pings.append(1)) == "back"
    assert attempt.calls == 5 and len(pings) == 5  # the watchdog fed before each
    assert actions(caplog) == ["store.lost", "store.reconnected"]
    done = caplog.records[-1]
    assert getattr(done, "count", None) == 5 and "after" in done.getMessage()


async def test_a_store_that_stays_away_ends_it_with_one_line_naming_the_limit(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runner.reconnect")
    policy = ReconnectPolicy(limit=0.2, first=0.01, cap=0.02)
    attempt = Attempts(*[StoreUnavailable(f"refused {n}") for n in range(10**3)])
    with pytest.raises(StoreUnavailable) as raised:
        await wait_out("worker core-processor", attempt, policy, first_error=LOST)
    message = raised.value.message
    assert message.startswith("worker core-processor: the store stayed unreachable for ")
    assert "--reconnect-max" in message and f"after {attempt.calls} attempts" in message
    assert message.endswith(f"refused {attempt.calls - 1}")  # the last error said
    assert "\n" not in message and attempt.calls > 2
    assert actions(caplog) == ["store.lost"]  # and no line per attempt


async def test_a_series_longer_than_a_minute_says_so_once_a_minute(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="runner.reconnect")
    monkeypatch.setattr(reconnect, "_repeats", reconnect.Repeats(window=0.05))
    attempt = Attempts(*[LOST] * 40)
    await wait_out("start", attempt, ReconnectPolicy(limit=10, first=0.01, cap=0.01),
                   first_error=LOST)
    said = actions(caplog)
    assert said[0] == "store.lost" and said[-1] == "store.reconnected"
    middle = said[1:-1]
    assert middle and set(middle) == {"store.reconnecting"} and len(middle) < 40
    left_out = [getattr(r, "repeats", None) for r in caplog.records
                if getattr(r, "action", "") == "store.reconnecting"]
    assert all(isinstance(n, int) for n in left_out) and sum(left_out) > 0  # type: ignore[arg-type]


@pytest.mark.parametrize("final", [
    ConfigMismatch("after reconnecting, the store is not the one this run opened"),
    LockHeld("another worker holds the lock"),
    TargetAbsent("no target there"),
])
async def test_what_no_reconnect_cures_is_raised_at_once(final: Exception) -> None:
    attempt = Attempts(LOST, final)
    with pytest.raises(type(final)):
        await wait_out("start", attempt, QUICK, first_error=LOST)
    assert attempt.calls == 2


async def test_a_stop_ends_the_wait_at_once() -> None:
    never = Attempts(*[LOST] * 10**6)
    with anyio.CancelScope() as scope:
        async def stop_soon() -> None:
            await anyio.sleep(0.05)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_soon)
            with anyio.fail_after(5):
                await wait_out("start", never, ReconnectPolicy(limit=60, first=0.001,
                                                               cap=0.01), first_error=LOST)
    assert scope.cancelled_caught and never.calls > 0


async def test_an_attempt_that_hangs_is_cut_at_its_timeout_and_tried_again() -> None:
    calls = 0

    async def hangs_once() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep_forever()
        return "back"

    policy = ReconnectPolicy(limit=5, first=0.001, cap=0.002, attempt_timeout=0.05)
    assert await wait_out("start", hangs_once, policy, first_error=LOST) == "back"
    assert calls == 2


class FakeStore:
    def __init__(self) -> None:
        self.reconnects = Attempts(LOST, result="")

    async def reconnect(self) -> None:
        await self.reconnects()


def body_failing(*failures: BaseException) -> tuple[Callable[[], object], list[int]]:
    runs: list[int] = []
    queue = list(failures)

    async def body() -> int:
        runs.append(1)
        if queue:
            raise queue.pop(0)
        return len(runs)

    return body, runs


async def test_work_over_a_lost_store_is_started_again_after_a_reconnect() -> None:
    store = FakeStore()
    body, runs = body_failing(ExceptionGroup("lanes", [LOST, LOST]))
    assert await riding_through(store, body, QUICK, what="pipeline core-processor") == 2  # type: ignore[arg-type]
    assert len(runs) == 2 and store.reconnects.calls == 2


async def test_without_a_policy_or_with_another_error_the_work_fails_as_it_did() -> None:
    body, runs = body_failing(LOST)
    with pytest.raises(StoreUnavailable):
        await riding_through(FakeStore(), body, reconnect.NEVER, what="job")  # type: ignore[arg-type]
    body, runs = body_failing(StoreError("the store is corrupt"))
    with pytest.raises(StoreError, match="corrupt"):
        await riding_through(FakeStore(), body, QUICK, what="job")  # type: ignore[arg-type]
    assert len(runs) == 1
