"""The lead loop of ``start`` (SPEC K4, L8, L12): cycles one after another, each recover →
reconcile → dispatch → poll pass, then a wait of ``interval``; heartbeats and the
supervisor's watchdog between cycles.  ``runner.loop`` runs it in the run's task group.

Riding through a lost store (issue 30).  A PostgreSQL server that restarts or fails over
ends the cycle where it is, fenced: a dispatch step that cannot commit sends nothing more,
and an in-flight mark passes only while the lock's session holds the lock
(``runner.tasks.reconnect``).  The loop then reconnects with a bounded backoff for at most
``reconnect.limit`` seconds, holds the lock again (or steps aside with exit 75 when
another worker took it), recovers (what was in flight becomes uncertain), and goes on.
While it reconnects the services say not ready, the supervisor's watchdog is fed before
each attempt (from the loop itself: a hung attempt, bounded, stops the pings), and the
first signal stops it at once (exit 0).  A lock session that ends while the loop waits
between cycles wakes it: the next cycle rides through before it dispatches anything.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio
from anyio.abc import TaskStatus

from runner.errors import LockLost
from runner.signals import Shutdown
from runner.tasks import deliver, poll, reconnect, target
from runner.tasks.outcomes import CycleSummary
from runner.tasks.reconnect import ReconnectPolicy, Tenure

if TYPE_CHECKING:
    from runner.alerts import Alerts
    from runner.io.systemd import Notifier
    from runner.worker import DurableWorker

log = logging.getLogger("runner.loop")


class Service(Protocol):
    """A server run from the task group (``start --listen``): started once the lock is
    held, asked to ``stop`` (drain, bounded by its own grace) when the cycles end, and
    cancelled at once by a hard stop."""

    async def run(self, shutdown: Shutdown, *, task_status: TaskStatus[None]) -> None: ...

    def stop(self) -> None: ...

    def reconnecting(self, active: bool) -> None:
        """The loop lost its store and tries again (True, before every attempt: the loop
        is alive, the lock is not held), or holds the lock again (False)."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    cycles: int | None = None  # None: until signalled
    interval: float = 5.0
    poll_limit: int = 100
    grace: float = 30.0
    dispatch_limit: int | None = None
    #: records per target request (None: the worker's ``batch_size``)
    batch_size: int | None = None
    #: emit only the cycles where something happened (and the first); idle cycles are
    #: logged at debug level.  ``start`` without ``--cycles`` runs this way.
    quiet_idle: bool = False
    #: seconds between heartbeat log lines (None: none)
    heartbeat: float | None = None
    #: how long to wait for a lost store (issue 30; ``limit`` 0: the loss ends the run)
    reconnect: ReconnectPolicy = reconnect.NEVER


def eventful(summary: CycleSummary, poll_changes: int, was_failing: bool) -> bool:
    """Whether a cycle is worth a line: it moved a record, its poll pass saw a changed
    snapshot or a missing row, or the poll pass started or stopped failing."""
    return bool(summary.moved or poll_changes or (summary.poll_failed > 0) != was_failing)


class Heartbeat:
    """A log line every ``period`` seconds (monotonic), from the lead loop, while cycles
    complete: it says the loop is alive and what it did since the last one."""

    def __init__(self, period: float | None) -> None:
        self.period = period
        self.due = anyio.current_time() + period if period else float("inf")
        self.cycles = 0
        self.moved = 0

    def count(self, summary: CycleSummary) -> None:
        self.cycles += 1
        self.moved += summary.moved

    def beat_if_due(self) -> None:
        now = anyio.current_time()
        if self.period is None or now < self.due:
            return
        log.info("alive: %d cycles, %d record transitions in the last %gs", self.cycles,
                 self.moved, self.period,
                 extra={"action": "runner.heartbeat", "cycles": self.cycles,
                        "moved": self.moved, "seconds": self.period})
        self.cycles = self.moved = 0
        self.due = now + self.period


def _status(cycle: int, summary: CycleSummary) -> str:
    """A cycle's counts for the supervisor (systemd's STATUS=)."""
    return (f"cycle {cycle}: {summary.dispatched} sent, {summary.confirmed} confirmed, "
            f"{summary.uncertain} uncertain, {summary.failed_safe} failed-safe, "
            f"{summary.polled} polled ({summary.poll_failed} failed)")


class LeadLoop:
    """The lead loop of one run, over the lock the run holds (``tenure``)."""

    def __init__(self, worker: DurableWorker, settings: LoopSettings, shutdown: Shutdown,
                 emit: Callable[[CycleSummary], None], tenure: Tenure, notifier: Notifier,
                 alerts: Alerts | None, services: Sequence[Service]) -> None:
        self.worker, self.settings, self.shutdown, self.emit = worker, settings, shutdown, emit
        self.tenure, self.notifier, self.alerts = tenure, notifier, alerts
        self.services = services
        self.heartbeat = Heartbeat(settings.heartbeat)

    async def run(self) -> None:
        settings, shutdown = self.settings, self.shutdown
        cycle, failing = 0, False
        recovered = self.tenure.recovered
        while not shutdown.stopping:
            if self.tenure.lock.lost and settings.reconnect.enabled:
                # heard between cycles: the lock's session ended (its fence refuses marks)
                again = await self._ride_through(LockLost(
                    "the worker lock's session ended while the loop waited"))
                if again is None:
                    return
                recovered += again
            summary = CycleSummary(recovered=recovered)
            try:
                poll_changes = await self._cycle(summary)
                figures = (await self.worker.store.lead_figures()
                           if self.alerts is not None and not shutdown.stopping else None)
            except Exception as exc:
                if not settings.reconnect.enabled or not reconnect.is_lost(exc):
                    raise
                if summary.moved:  # what the cut cycle did, as every cycle says it
                    self.emit(summary)
                again = await self._ride_through(exc)
                if again is None:
                    return
                recovered = again
                continue
            recovered = 0
            if not settings.quiet_idle or cycle == 0 or eventful(summary, poll_changes,
                                                                 failing):
                self.emit(summary)
            else:
                log.debug("idle cycle: nothing moved", extra={"action": "cycle.idle",
                                                              "cycle": cycle + 1})
            failing = summary.poll_failed > 0
            self.heartbeat.count(summary)
            cycle += 1
            if not shutdown.stopping:  # a cycle cut short by a stop is not progress
                if self.notifier.enabled:  # no supervisor: nothing to format
                    self.notifier.progressed(_status(cycle, summary))
                if self.alerts is not None:
                    self.alerts.cycle_done(summary, figures, anyio.current_time(),
                                           self.worker.clock.now())
            if settings.cycles is not None and cycle >= settings.cycles:
                return
            await self._wait()

    async def _cycle(self, summary: CycleSummary) -> int:
        """One cycle and its poll pass, filling ``summary``; the poll's changes."""
        worker, settings, shutdown = self.worker, self.settings, self.shutdown
        with shutdown.work():
            await deliver.run_cycle(worker.store, worker.port, worker.clock, guard=shutdown,
                                    dispatch_limit=settings.dispatch_limit, summary=summary,
                                    batch_size=settings.batch_size or worker.batch_size,
                                    backoff=worker.backoff, pipeline=worker.dispatch_pipeline)
            if not shutdown.stopping:
                polled = await poll.poll_pass(worker.store, worker.port, worker.clock,
                                              settings.poll_limit, target.TRUSTED)
                summary.polled, summary.poll_failed = polled.polled, polled.failed
                return polled.changed + polled.missing
        return 0

    async def _ride_through(self, lost: BaseException) -> int | None:
        """Reconnect, hold the lock again and recover (``Tenure.regain``), for at most
        the policy's limit; the records recovered, or None when a signal stopped it."""
        self._reconnecting(True)
        self.notifier.send("STATUS=the store was lost: reconnecting")

        def alive() -> None:
            self.notifier.ping_if_due()
            self._reconnecting(True)

        recovered = None
        with self.shutdown.work():  # the first signal cancels the wait and the attempt
            recovered = await reconnect.wait_out(
                "start", self.tenure.regain, self.settings.reconnect, first_error=lost,
                alive=alive)
        if recovered is None or self.shutdown.stopping:
            return None
        self._reconnecting(False)
        self.notifier.send("STATUS=reconnected: the lock is held again")
        await self._announce_replication()
        return recovered

    async def _announce_replication(self) -> None:
        """After a reconnect, say again what is durable: a failover may have turned
        synchronous replication into a single server (issue 30 point 4)."""
        from runner.errors import StoreError
        from runner.replication import announce

        try:
            replication = await self.worker.store.replication()
        except StoreError:  # the next cycle meets the store's failure itself
            return
        log.info("replication after the reconnect: %s", replication.mode, extra={
            "action": "replication.after_reconnect", "replication": replication.mode})
        announce(replication)

    def _reconnecting(self, active: bool) -> None:
        for service in self.services:
            service.reconnecting(active)

    async def _wait(self) -> None:
        """Wait ``interval`` seconds between cycles (monotonic), writing heartbeats and
        feeding the supervisor's watchdog when due; returns at once when a stop is asked
        for, or when the lock's session ends (the next cycle rides through it first)."""
        heartbeat, notifier, shutdown = self.heartbeat, self.notifier, self.shutdown
        lock = self.tenure.lock
        end = anyio.current_time() + self.settings.interval
        while not shutdown.stopping and not lock.lost:
            heartbeat.beat_if_due()
            notifier.ping_if_due()
            now = anyio.current_time()
            left = end - now
            if left <= 0:
                return
            with anyio.move_on_after(min(left, max(min(heartbeat.due, notifier.next_ping)
                                                   - now, 0.0))):
                await _first(shutdown.wait_stopped, lock.wait_lost)


async def _first(*waits: Callable[[], Awaitable[None]]) -> None:
    """Until the first of ``waits`` returns."""
    async with anyio.create_task_group() as tg:
        async def one(wait: Callable[[], Awaitable[None]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(one, wait)
