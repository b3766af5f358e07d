"""Riding through a lost store (issue 30): reconnect with a bounded backoff, take the
worker lock again, recover, and go on.

Why a long-running command waits instead of exiting.  A PostgreSQL store can go away
under a worker for reasons that pass by themselves: the server restarts, a standby is
promoted, a network path drops.  ``start``, ``worker`` and ``job`` then wait it out for at
most ``--reconnect-max`` seconds (default :data:`DEFAULT_RECONNECT_MAX`), trying again
after a delay that doubles from :data:`FIRST_DELAY` up to :data:`MAX_DELAY`, each drawn
between half of it and all of it (jitter: a fleet of workers does not knock in step).
Each attempt may take at most :data:`ATTEMPT_TIMEOUT`.  A store that stays away longer
ends the command with ``StoreUnavailable`` (exit 74) and one line saying so; a store that
comes back as another store (another scope, another schema version, no store at all)
ends it at once with that error.  One-shot commands never wait: they exit 74.

Why nothing is sent twice meanwhile.  The cycle that lost its store ends where it is: a
dispatch step that cannot commit sends nothing more, and an in-flight mark on
PostgreSQL passes only while the lock's session holds the lock (the fence; a lost lock's
fence refuses every mark without a statement).  What was in flight when the store went
away stays in flight in the store.  :class:`Tenure` then opens the store's session anew
(in place: the HTTP intake beside the loop goes on with it), holds the lock again, checks
the target as at start, and makes every in-flight record uncertain (L7), so it is read
back, never resent.  If another worker took the lock meanwhile, this one steps aside with
``LockHeld`` (exit 75).

What is logged: one ``store.lost`` warning when a series of attempts starts, then at most
one ``store.reconnecting`` line a minute while it lasts (``runner.logs.Repeats``: each
says how many attempts it left out), and one ``store.reconnected`` line at the end.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import anyio

from runner import limits
from runner.clock import Clock
from runner.errors import LockHeld, LockLost, StoreUnavailable, TargetAbsent, TargetUnavailable
from runner.errors import leaves as error_leaves
from runner.leads.port import CRMRecordPort
from runner.logs import Repeats
from runner.tasks.rewind import take_over

if TYPE_CHECKING:
    from runner.store import DeliveryStore, Reconnecting, WorkerLock

log = logging.getLogger("runner.reconnect")

T = TypeVar("T")

#: seconds a command waits for a lost store by default (``--reconnect-max``)
DEFAULT_RECONNECT_MAX = limits.DEFAULT_RECONNECT_MAX
#: the first delay before an attempt, doubled after each failed one up to MAX_DELAY
FIRST_DELAY = 0.1
MAX_DELAY = 2.0
#: seconds one attempt may take (a connect, a check of the store, the lock, recovery)
ATTEMPT_TIMEOUT = 30.0
#: at most one ``store.reconnecting`` line this often (seconds)
REPORT_EVERY = 60.0


@dataclass(frozen=True)
class ReconnectPolicy:
    """How long to wait for a lost store, and how often to knock (``limit`` 0: never;
    the first loss ends the command, as a one-shot command ends)."""

    limit: float = DEFAULT_RECONNECT_MAX
    first: float = FIRST_DELAY
    cap: float = MAX_DELAY
    attempt_timeout: float = ATTEMPT_TIMEOUT

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def delay(self, failures: int, draw: Callable[[], float] = random.random) -> float:
        """The wait before the next attempt after ``failures`` failed ones (0: the first
        attempt): ``first * 2**failures`` at most ``cap``, drawn from its upper half."""
        full = min(self.cap, self.first * 2.0 ** min(failures, 32))
        return full / 2 + draw() * full / 2


NEVER = ReconnectPolicy(limit=0)


def is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the store's session (``StoreUnavailable``) or the lock's
    (``LockLost``) is gone: every leaf of a group must say so."""
    found = error_leaves(exc)
    return bool(found) and all(isinstance(e, StoreUnavailable | LockLost) for e in found)


def _transient(exc: BaseException) -> bool:
    """An attempt's failure worth another attempt: the store still away, or a target that
    the checks at the lock's acquisition cannot reach now (the same server may hold both)."""
    return is_lost(exc) or (isinstance(exc, TargetUnavailable)
                            and not isinstance(exc, TargetAbsent))


def _first_line(exc: BaseException) -> str:
    found = error_leaves(exc)
    first = found[0] if found else exc
    return str(getattr(first, "message", None) or first or type(first).__name__)


_repeats = Repeats(REPORT_EVERY)


async def wait_out(
    what: str, attempt: Callable[[], Awaitable[T]], policy: ReconnectPolicy, *,
    first_error: BaseException, alive: Callable[[], None] | None = None,
    retry: Callable[[BaseException], bool] = _transient,
) -> T:
    """Call ``attempt`` until it succeeds, waiting ``policy.delay`` before each try; its
    result.  ``retry`` says which failures are tried again (others are raised as they
    are); after ``policy.limit`` seconds from the first call, ``StoreUnavailable`` says
    that the store stayed away.  ``alive`` is called before every attempt (the loop is
    alive: a supervisor's watchdog is fed).  Cancellation (a stop) ends it at once."""
    started = anyio.current_time()
    deadline = started + policy.limit
    last = _first_line(first_error)
    key = ("store.reconnecting", what)
    _repeats.admit(key)  # this line opens the series: "still reconnecting" waits a window
    log.warning("%s: lost its session to the store (%s); reconnecting for at most %gs",
                what, last,
                policy.limit, extra={"action": "store.lost", "task": what,
                                     "error": type(error_leaves(first_error)[0]).__name__,
                                     "seconds": policy.limit})
    failures = 0
    while True:
        pause = policy.delay(failures)
        now = anyio.current_time()
        if now + pause > deadline:
            _repeats.forget(key)
            raise StoreUnavailable(
                f"{what}: the store stayed unreachable for {now - started:.0f} s (at most "
                f"{policy.limit:g} s, --reconnect-max); gave up after {failures} "
                f"attempt{'s' if failures != 1 else ''}; the last: {last}")
        await anyio.sleep(pause)
        if alive is not None:
            alive()
        try:
            with anyio.fail_after(policy.attempt_timeout):
                result = await attempt()
        except TimeoutError:
            last = f"no answer within {policy.attempt_timeout:g} s"
        except Exception as exc:  # sorted by retry(): the rest is raised
            if not retry(exc):
                _repeats.forget(key)
                raise
            last = _first_line(exc)
        else:
            _repeats.forget(key)
            took = anyio.current_time() - started
            log.info("%s: reconnected to the store after %.1fs (%d attempt%s)", what, took,
                     failures + 1, "s" if failures else "",
                     extra={"action": "store.reconnected", "task": what,
                            "count": failures + 1, "seconds": round(took, 3)})
            return result
        failures += 1
        log.debug("%s: reconnect attempt %d failed: %s", what, failures, last,
                  extra={"action": "store.reconnect_failed", "task": what, "count": failures})
        left_out = _repeats.admit(key)
        if left_out is not None:
            log.warning("%s: still reconnecting to the store after %.0fs, %d attempts (%d "
                        "not logged): %s", what, anyio.current_time() - started, failures,
                        left_out, last,
                        extra={"action": "store.reconnecting", "task": what,
                               "count": failures, "repeats": left_out,
                               "seconds": round(anyio.current_time() - started)})


async def riding_through(
    store: Reconnecting, body: Callable[[], Awaitable[T]], policy: ReconnectPolicy, *,
    what: str, alive: Callable[[], None] | None = None,
) -> T:
    """Run ``body`` over ``store``; when it fails because the store's session is lost,
    reconnect the store (:func:`wait_out`) and run ``body`` again, from its start.  For
    work that is safe to start over (the pipeline's claims and leases, the sweep, a job
    that resumes from the store)."""
    while True:
        try:
            return await body()
        except Exception as exc:  # a lost store is waited out; anything else is raised
            if not policy.enabled or not is_lost(exc):
                raise
            await wait_out(what, store.reconnect, policy, first_error=exc, alive=alive,
                           retry=is_lost)


class Tenure:
    """The worker lock of a run of cycles (``start``), held again after a lost store."""

    def __init__(self, store: DeliveryStore, port: CRMRecordPort | None, clock: Clock,
                 lock: WorkerLock, recovered: int) -> None:
        self.store, self.port, self.clock, self.lock = store, port, clock, lock
        #: records recovered when the lock was (last) taken
        self.recovered = recovered

    async def regain(self) -> int:
        """One attempt: the store's session anew, the lock held again (kept, if its own
        session survived), the target checked, every in-flight record made uncertain.
        Returns how many were.  ``LockHeld`` (exit 75): another worker took the lock
        meanwhile, and this one steps aside."""
        await self.store.reconnect()
        try:
            await self.lock.regain()
        except LockHeld as exc:
            raise LockHeld(f"{exc.message.removesuffix('; not starting')}: it took over "
                           "while this worker was reconnecting; stepping aside",
                           holder_pid=exc.holder_pid) from None
        self.recovered = await take_over(self.store, self.port, self.clock)
        return self.recovered


@asynccontextmanager
async def tenure(store: DeliveryStore, port: CRMRecordPort | None, clock: Clock
                 ) -> AsyncIterator[Tenure]:
    """Hold the worker lock for a run (``runner.tasks.deliver.holding_lock``: the target
    checked, in-flight records recovered), as a :class:`Tenure` that can hold it again
    after a lost store.  Raises LockHeld (exit 75) at once if another worker holds it."""
    async with store.worker_lock() as lock:
        yield Tenure(store, port, clock, lock, await take_over(store, port, clock))
