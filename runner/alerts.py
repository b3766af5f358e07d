"""Alerts (issue 19): an operator's command, run with a JSON document on stdin, when
something needs a person, and never when nothing does.

``start --alert-command CMD`` (and ``once``) watches five conditions:

* ``record_uncertain``: a cycle made records uncertain (an event, not a condition);
* ``uncertain_too_old``: the oldest uncertain record was accepted more than
  ``--alert-uncertain-age`` seconds ago;
* ``poll_failing``: ``--alert-poll-failures`` poll passes in a row read nothing;
* ``cycle_stalled``: no cycle completed for ``--alert-cycle-stall`` seconds (a send stuck
  on a target that never answers);
* ``store_failed``: the store is full or cannot be reached (the run ends; exit 74).

A condition alerts when it begins (``"state": "firing"``), again every ``--alert-repeat``
seconds while it lasts, and once when it clears (``"state": "resolved"``).  Every alert
kind is deduplicated over ``--alert-repeat``: what is held back is counted in the next
one (``suppressed``).  At most ``PER_HOUR`` commands run per hour; beyond that alerts are
dropped and counted (``dropped`` in the next one that runs).

The command runs apart from the loop (a task of its own, fed through a bounded queue), is
killed after ``--alert-timeout`` seconds, and its failure is logged, never raised: an alert
that cannot be sent must not stop delivery.  The document carries counts, ages and the
store's described location, never a record's contents.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from runner.clock import from_text
from runner.figures import LeadFigures
from runner.leads.states import LeadState
from runner.logs import stamp
from runner.tasks.outcomes import CycleSummary

log = logging.getLogger("runner.alerts")

#: commands run per rolling hour at the most (beyond: dropped, counted)
PER_HOUR = 30
#: alerts waiting for the sender at the most (beyond: dropped, counted)
QUEUE = 64


@dataclass(frozen=True)
class AlertSettings:
    command: Sequence[str]
    uncertain_age: float = 3600.0
    poll_failures: int = 3
    cycle_stall: float = 600.0
    repeat: float = 3600.0
    timeout: float = 10.0
    #: the store, described (a DSN's password is never in it)
    store: str = ""


@dataclass
class _Condition:
    firing: bool = False
    last_sent: float = float("-inf")
    suppressed: int = 0
    since: float = 0.0


@dataclass
class Alerts:
    """Decides when to alert (each check takes the monotonic ``now``), and sends."""

    settings: AlertSettings
    _conditions: dict[str, _Condition] = field(default_factory=dict)
    _poll_failed_passes: int = 0
    _last_cycle: float | None = None
    _sent_at: deque[float] = field(default_factory=deque)
    _dropped: int = 0
    #: alerts waiting for the sender (at most QUEUE)
    _queue: deque[dict[str, Any]] = field(default_factory=deque)
    #: set when an alert is queued (made by the sender, inside the event loop)
    _wake: anyio.Event | None = None
    #: held while a command runs: the run's last flush waits for the send in progress
    _busy: anyio.Lock | None = None

    # -- what the loop tells it ----------------------------------------------------------

    def started(self, now: float) -> None:
        """The lock is held: the cycle-stall clock starts."""
        self._last_cycle = now

    def cycle_done(self, summary: CycleSummary, figures: LeadFigures | None,
                   now: float, wall: datetime) -> None:
        self._last_cycle = now
        self._condition("cycle_stalled", False, now, {})
        new = summary.uncertain + summary.recovered  # recovery makes in-flight uncertain
        if new:
            uncertain = figures.counts.get(LeadState.UNCERTAIN) if figures else None
            self._event("record_uncertain", now, {
                "new": new, "uncertain_now": uncertain,
                "summary": f"{new} record(s) became uncertain: each is "
                           "reconciled by readback; 'runner uncertain' lists them"})
        if figures is not None:
            age = _age(figures.oldest_uncertain_accepted_at, wall)
            self._condition("uncertain_too_old", age is not None
                            and age > self.settings.uncertain_age, now, {
                                "oldest_age_seconds": age,
                                "threshold_seconds": self.settings.uncertain_age,
                                "summary": "an uncertain record has waited longer than the "
                                           "threshold: see 'runner uncertain'"})
        if summary.polled:
            all_failed = summary.poll_failed == summary.polled
            self._poll_failed_passes = self._poll_failed_passes + 1 if all_failed else 0
            self._condition("poll_failing",
                            self._poll_failed_passes >= self.settings.poll_failures, now, {
                                "passes": self._poll_failed_passes,
                                "threshold": self.settings.poll_failures,
                                "summary": "every status read failed in consecutive poll "
                                           "passes: the target cannot be read"})

    def check_stall(self, now: float) -> None:
        if self._last_cycle is None:
            return
        waited = now - self._last_cycle
        self._condition("cycle_stalled", waited > self.settings.cycle_stall, now, {
            "seconds_since_last_cycle": round(waited, 3),
            "threshold_seconds": self.settings.cycle_stall,
            "summary": "no cycle completed within the threshold: a send or a read may be "
                       "stuck"})

    def next_stall_check(self) -> float:
        """When a stall would begin (monotonic), or when to repeat one that lasts."""
        if self._last_cycle is None:
            return float("inf")
        stalled = self._conditions.get("cycle_stalled")
        if stalled is not None and stalled.firing:
            return stalled.last_sent + self.settings.repeat
        return self._last_cycle + self.settings.cycle_stall + 0.001

    def store_failed(self, reason: str, message: str) -> dict[str, Any]:
        """The alert for a store that is full or unreachable (sent with ``send_now``)."""
        return self._document("store_failed", "firing", {
            "reason": reason, "error": message,
            "summary": "the store failed: the worker stopped (exit 74)"})

    # -- deciding --------------------------------------------------------------------------

    def _event(self, kind: str, now: float, details: dict[str, Any]) -> None:
        state = self._conditions.setdefault(kind, _Condition())
        if now - state.last_sent < self.settings.repeat:
            state.suppressed += 1
            return
        self._queue_alert(kind, "firing", state, now, details)

    def _condition(self, kind: str, holds: bool, now: float, details: dict[str, Any]) -> None:
        state = self._conditions.setdefault(kind, _Condition())
        if holds and (not state.firing or now - state.last_sent >= self.settings.repeat):
            if not state.firing:
                state.since = now
            state.firing = True
            self._queue_alert(kind, "firing", state, now, details)
        elif not holds and state.firing:
            state.firing = False
            self._queue_alert(kind, "resolved", state, now, {
                "lasted_seconds": round(now - state.since, 3)})

    def _queue_alert(self, kind: str, status: str, state: _Condition, now: float,
                     details: dict[str, Any]) -> None:
        while self._sent_at and now - self._sent_at[0] > 3600:
            self._sent_at.popleft()
        if len(self._sent_at) >= PER_HOUR:
            self._dropped += 1
            log.warning("alert %s dropped: %d alerts in the last hour already", kind,
                        PER_HOUR, extra={"action": "alert.dropped", "alert": kind})
            return
        if len(self._queue) >= QUEUE:
            self._dropped += 1
            return
        self._queue.append(self._document(kind, status,
                                          {**details, "suppressed": state.suppressed}))
        if self._wake is not None:
            self._wake.set()
        state.last_sent, state.suppressed = now, 0
        self._sent_at.append(now)

    def _document(self, kind: str, status: str, details: dict[str, Any]) -> dict[str, Any]:
        document = {"alert": kind, "state": status,
                    "ts": stamp(datetime.now(UTC).timestamp(), 3),
                    "host": socket.gethostname(), "pid": os.getpid(),
                    "store": self.settings.store, "dropped": self._dropped, **details}
        self._dropped = 0
        return document

    # -- sending ----------------------------------------------------------------------------

    async def run_sender(self) -> None:
        """Run the command for each queued alert, one at a time (a task of the loop)."""
        while True:
            await self.flush()
            self._wake = anyio.Event()
            if not self._queue:
                await self._wake.wait()

    async def flush(self) -> None:
        """Send what is queued, in order, each bounded by the timeout (after the send
        in progress, if any)."""
        if self._busy is None:
            self._busy = anyio.Lock()
        async with self._busy:
            while self._queue:
                await self.send_now(self._queue.popleft())

    async def send_now(self, document: dict[str, Any]) -> None:
        """Run the command once with ``document`` on stdin; killed after the timeout; a
        failure is logged."""
        data = (json.dumps(document, sort_keys=True) + "\n").encode()
        kind = document["alert"]
        try:
            process = await anyio.open_process(
                list(self.settings.command), stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as exc:
            log.error("alert %s: cannot run the alert command: %s", kind,
                      exc.strerror or exc, extra={"action": "alert.failed", "alert": kind})
            return
        code: int | None = None
        with anyio.move_on_after(self.settings.timeout, shield=True):
            try:
                assert process.stdin is not None
                await process.stdin.send(data)
                await process.stdin.aclose()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the command did not read its input: its exit code says the rest
            code = await process.wait()
        if code is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
            log.error("alert %s: the alert command did not finish within %gs; killed",
                      kind, self.settings.timeout,
                      extra={"action": "alert.failed", "alert": kind})
        elif code != 0:
            log.error("alert %s: the alert command exited %d", kind, code,
                      extra={"action": "alert.failed", "alert": kind})
        else:
            log.info("alert %s %s sent", kind, document["state"],
                     extra={"action": "alert.sent", "alert": kind})


def _age(accepted_at: str | None, wall: datetime) -> float | None:
    if accepted_at is None:
        return None
    return round((wall - from_text(accepted_at)).total_seconds(), 3)
