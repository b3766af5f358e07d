"""Pacing and backoff (issue 16 point 3, SPEC E2): how often runner may ask a target, and
when a record that was not sent is tried again.

Two different clocks, on purpose:

* :class:`Pacer` spaces *requests* (a batch write, a readback, a status read) on the
  monotonic clock of this process: a token bucket of ``rate`` requests per second holding
  ``burst`` tokens (one by default: requests evenly spaced, so no window of ``1/rate``
  seconds ever sees two).  A target's ``RateLimited`` answer holds every request until
  its ``retry_after`` has passed (:meth:`Pacer.hold`).  Nothing about pacing is durable:
  a new process starts with an empty schedule, and the target's own quota answers
  (RateLimited) cover the moment after a restart.
* :class:`Backoff` schedules *records*: a ``failed_safe`` record is not due again before
  its next attempt time, which is stored with it (wall clock, ``runner.clock``), so a
  restart keeps the schedule.  Truncated exponential with "equal jitter": after the n-th
  send, a wait drawn uniformly from ``[d/2, d]`` with ``d = min(cap, base * 2**(n-1))``,
  so the wait at least doubles from one half-range to the next, never exceeds ``cap``,
  and workers that failed together spread out.

Both take their clock (and randomness) as arguments: tests drive them without sleeping.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import anyio

from runner.errors import UsageError

#: the granularity of a blocking wait that can be interrupted (a stop, an abandoned run)
WAIT_SLICE = 0.05

#: default backoff: the first retry after 0.5-1 s, then doubling up to 5 minutes
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_CAP = 300.0


def parse_rate(text: str) -> float:
    """``N/min``, ``N/s`` (``N/sec``, ``N/m``, ``N/h``) or a bare N (per second) as
    requests per second; refuses anything else, zero and negatives."""
    value, _, unit = text.strip().partition("/")
    per = {"": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0,
           "minute": 60.0, "h": 3600.0, "hour": 3600.0}.get(unit.strip().lower())
    try:
        count = float(value)
    except ValueError:
        count = float("nan")
    if per is None or not count > 0 or count == float("inf"):
        raise UsageError(f"rate {text!r}: give requests per time, such as 60/min or 2/s")
    return count / per


def parse_duration(text: str) -> float:
    """``500ms``, ``1s``, ``5min`` (``m``), ``1h``, ``2d`` or bare seconds, as seconds
    (>= 0, less than 30 days)."""
    raw = text.strip().lower()
    for unit, scale in (("ms", 0.001), ("min", 60.0), ("s", 1.0), ("m", 60.0),
                        ("h", 3600.0), ("d", 86400.0)):
        if raw.endswith(unit):
            raw, factor = raw[: -len(unit)], scale
            break
    else:
        factor = 1.0
    try:
        seconds = float(raw) * factor
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < 30 * 86400:
        raise UsageError(f"duration {text!r}: give a time such as 1s, 500ms, 5min, 1h "
                         "or 2d (less than 30 days)")
    return seconds


@dataclass(frozen=True)
class Backoff:
    """When a record that failed safe is due again (see the module docstring)."""

    base: float = DEFAULT_RETRY_BASE
    cap: float = DEFAULT_RETRY_CAP
    rand: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (0 <= self.base <= self.cap < 30 * 86400):
            raise UsageError(f"retry base {self.base:g}s and cap {self.cap:g}s: need "
                             "0 <= base <= cap < 30 days")

    def delay(self, attempts: int) -> float:
        """Seconds to wait after a record's ``attempts``-th send failed safe."""
        span = min(self.cap, self.base * 2.0 ** min(max(attempts - 1, 0), 60))
        return span / 2 + self.rand() * span / 2

    def next_attempt(self, attempts: int, now: datetime,
                     retry_after: float | None = None) -> datetime:
        """The record's next attempt time.  A target that said when to come back
        (``RateLimited.retry_after``) is believed: then that, not the exponential, and
        never beyond ``cap`` (the pacer holds every request until then anyway)."""
        if retry_after is not None and retry_after >= 0:
            return now + timedelta(seconds=min(retry_after, self.cap))
        return now + timedelta(seconds=self.delay(attempts))


class Pacer:
    """A token bucket shared by every request runner makes to one target (see the module
    docstring).  Thread-safe: the dispatch run's thread and the event loop both take
    tokens.  ``rate`` None: no quota, only holds (``RateLimited``) apply.

    ``monotonic``, ``sleep`` and ``async_sleep`` are injectable (tests pass a fake clock
    that the fake sleeps advance)."""

    def __init__(self, rate: float | None = None, *, burst: int = 1,
                 default_hold: float = DEFAULT_RETRY_BASE,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 async_sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> None:
        if rate is not None and not rate > 0:
            raise UsageError("a target rate must be more than 0 requests per second")
        if burst < 1:
            raise UsageError("a pacer's burst is at least 1 request")
        self.rate, self.burst, self.default_hold = rate, burst, default_hold
        self._monotonic, self._sleep, self._async_sleep = monotonic, sleep, async_sleep
        self._lock = threading.Lock()
        now = monotonic()
        #: the time at which the bucket would be full again (tokens = burst); a request
        #: takes a token by moving it on by 1/rate
        self._full_at = now
        #: no request before this (a RateLimited answer)
        self._held_until = now
        #: requests taken and the seconds spent waiting for tokens (the bench's figures)
        self.taken = 0
        self.waited = 0.0

    def reserve(self) -> float:
        """Take a token: the seconds to wait before the request may go (0: at once).  The
        reservation stands even if the caller then does not send (a slot goes unused;
        the quota is never exceeded)."""
        with self._lock:
            now = self._monotonic()
            at = max(now, self._held_until)
            if self.rate is not None:
                interval = 1.0 / self.rate
                # with tokens = burst - (full_at - at) * rate, a token is there once
                # full_at - at <= (burst - 1) / rate
                at = max(at, self._full_at - (self.burst - 1) * interval)
                self._full_at = max(self._full_at, at) + interval
            self.taken += 1
            wait = max(at - now, 0.0)
            self.waited += wait
            return wait

    def unpaced(self) -> bool:
        """No quota, and no hold in force: a request may go at once, whenever it goes
        (the pipelined dispatch marks a batch beside the request before it only then)."""
        with self._lock:
            return self.rate is None and self._monotonic() >= self._held_until

    def hold(self, retry_after: float | None) -> None:
        """The target answered RateLimited: no request for ``retry_after`` seconds (its
        own figure; ``default_hold`` when it gave none)."""
        seconds = self.default_hold if retry_after is None else max(retry_after, 0.0)
        with self._lock:
            self._held_until = max(self._held_until, self._monotonic() + seconds)

    def pause(self, seconds: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait ``seconds`` (a reservation's) in this thread; False (and the request must
        not go) if ``stop()`` turns true meanwhile, checked every ``WAIT_SLICE``."""
        deadline = self._monotonic() + seconds
        while (left := deadline - self._monotonic()) > 0:
            if stop():
                return False
            self._sleep(min(left, WAIT_SLICE))
        return not stop()

    def take_blocking(self) -> None:
        """Take a token and wait for it, not interruptible but by abandoning the thread
        (the readback of a request already sent)."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)

    async def take(self) -> None:
        """Take a token and wait for it on the event loop (cancellable)."""
        wait = self.reserve()
        if wait > 0:
            await self._async_sleep(wait)
