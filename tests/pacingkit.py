"""The clocks of the pacing tests (``tests/test_pacing.py``,
``tests/test_pacing_dispatch.py``): the store's wall clock, moved by the test, and the
pacer's monotonic clock, whose sleeps move it (no test waits for real)."""

from __future__ import annotations

from datetime import UTC, datetime

from runner.leads.pacing import Pacer

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class StepClock:
    """The store's wall clock, moved by the test."""

    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


class FakeTime:
    """The pacer's monotonic clock; its sleeps move it (no test waits for real)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def pacer(self, rate: float | None, burst: int = 1) -> Pacer:
        return Pacer(rate, burst=burst, monotonic=self.monotonic, sleep=self.sleep,
                     async_sleep=self.async_sleep)
