"""Liveness and readiness (SPEC E4), decided in pure code from what the loop reports.

* ``/healthz``: the process answers, and — when it runs the delivery loop — the loop
  completed a cycle within ``intervals`` cycle intervals (counted from the start until
  the first cycle completes).  A loop stuck in a hung reconcile or a store that blocks
  every cycle turns it unhealthy; a supervisor may then restart the process.
* ``/readyz``: the worker lock is held (``start``; ``serve`` needs none), the store
  answers a small read, and the process is not stopping.  A load balancer sends webhooks
  only to a ready process; a stopping one drains what it already received.  The body
  says which replication guarantee the store runs under (``replication``: read with the
  probe, ``runner.replication``); with ``--require-synchronous-replication`` a store that
  is not synchronous is not ready (its intake refuses events).

While ``start`` reconnects to a lost store (issue 30) it is not ready (``lock`` false,
``reconnecting`` true) but alive: each reconnect attempt counts as a sign of life for
``/healthz``, as a completed cycle does (a supervisor's restart would not bring the
store back sooner).

Times are monotonic seconds, passed in, so the rules are tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runner.replication import Replication

Mode = Literal["start", "serve"]
#: the shortest cycle interval the liveness rule counts with (``--interval 0`` runs
#: cycles back to back; a second is still a sane unit for "within N intervals")
MIN_INTERVAL = 1.0


@dataclass
class LoopState:
    """What the HTTP endpoints know of the process: set by the runner loop, read here."""

    mode: Mode
    started_at: float
    interval: float = 5.0
    intervals: int = 3
    lock_held: bool = False
    #: set when a stop is asked for; ``stop_source`` (the runner loop's) is asked too
    stop_asked: bool = False
    stop_source: Callable[[], bool] | None = None
    last_cycle_at: float | None = None
    #: set while the loop reconnects to a lost store; its last attempt's monotonic time
    reconnecting: bool = False
    last_attempt_at: float | None = None
    cycles: int = 0
    #: wall-clock time of the last completed cycle (for the metric)
    last_cycle_wall: float | None = field(default=None)
    #: the replication guarantee the store last said (read by the /readyz probe)
    replication: Replication | None = None
    #: --require-synchronous-replication: not ready unless replication is synchronous
    require_synchronous: bool = False

    @property
    def stopping(self) -> bool:
        return self.stop_asked or (self.stop_source is not None and self.stop_source())

    def cycle_done(self, monotonic_now: float, wall_now: float) -> None:
        self.last_cycle_at, self.last_cycle_wall = monotonic_now, wall_now
        self.cycles += 1

    def reconnect(self, active: bool, monotonic_now: float) -> None:
        """The loop tries to reconnect (an attempt now), or holds the lock again."""
        self.reconnecting = active
        self.lock_held = not active
        if active:
            self.last_attempt_at = monotonic_now


def liveness(state: LoopState, now: float) -> tuple[bool, dict[str, Any]]:
    """(healthy, body) for ``/healthz``."""
    if state.mode == "serve":
        return True, {"status": "ok", "mode": "serve"}
    since = max(t for t in (state.last_cycle_at, state.last_attempt_at, state.started_at)
                if t is not None)
    age = max(0.0, now - since)
    limit = state.intervals * max(state.interval, MIN_INTERVAL)
    healthy = age <= limit
    return healthy, {
        "status": "ok" if healthy else "stale",
        "mode": "start",
        "cycles": state.cycles,
        "seconds_since_cycle": round(age, 3),
        "limit_seconds": limit,
        "reconnecting": state.reconnecting,
    }


def readiness(state: LoopState, store_ok: bool) -> tuple[bool, dict[str, Any]]:
    """(ready, body) for ``/readyz``."""
    lock: bool | None = state.lock_held if state.mode == "start" else None
    replication = state.replication
    refusing = state.require_synchronous and (replication is None
                                              or not replication.synchronous)
    ready = store_ok and not state.stopping and lock is not False and not refusing
    return ready, {
        "ready": ready,
        "mode": state.mode,
        "lock": lock,
        "store": store_ok,
        "stopping": state.stopping,
        "reconnecting": state.reconnecting,
        "replication": None if replication is None else replication.to_json(),
        "require_synchronous": state.require_synchronous,
    }
