"""The foreground runner loop (SPEC K4, L8, L12): ``start`` and ``once``.

One anyio task group holds everything for the whole run: the signal watcher, the lead
loop (recover → reconcile → dispatch → poll pass, then wait ``interval``) and any
background tasks (the lifecycle sweep, pipeline workers), each isolated so a hung or
failing one never delays the next lead cycle.  The worker lock is held from before the
first cycle to after the last.

Shutdown is cancellation, in two steps:

* the first SIGINT/SIGTERM stops new work.  A send already in flight (from its in-flight
  mark to its recorded outcome) runs in a shielded scope and may finish for at most
  ``grace`` seconds; reads (reconcile, polls) are simply cancelled.  Exit 0.
* a second signal, or the grace running out, cancels the send at once: its record is
  marked uncertain within a short shielded window (else it stays in flight and the next
  start makes it uncertain).  Exit 128 + signal (130 SIGINT, 143 SIGTERM).

Handlers are installed explicitly (``open_signal_receiver``), so a process started with
SIGINT ignored — a background job of a non-interactive shell — still stops on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from runner import signals as stop_signals
from runner.alerts import Alerts
from runner.errors import leaves
from runner.io.systemd import Notifier
from runner.signals import Shutdown
from runner.tasks import deliver, poll, target
from runner.tasks.outcomes import CycleSummary
from runner.worker import DurableWorker

log = logging.getLogger("runner.loop")

BackgroundTask = tuple[str, Callable[[], Awaitable[None]]]


class Service(Protocol):
    """A server run from the task group (``start --listen``): started once the lock is
    held, asked to ``stop`` (drain, bounded by its own grace) when the cycles end, and
    cancelled at once by a hard stop."""

    async def run(self, shutdown: Shutdown, *, task_status: TaskStatus[None]) -> None: ...

    def stop(self) -> None: ...


class Drainable(Protocol):
    """Background tasks that can finish their pending work and return (the pipeline
    workers' ``runner.pipeline.workers.Drain``)."""

    def request(self) -> None: ...

    async def wait_done(self) -> None: ...
#: pause before a crashed background task is started again
RESTART_DELAY = 5.0


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


async def _isolated(name: str, task: Callable[[], Awaitable[None]]) -> None:
    """Run a background task; its failures are logged and it is started again, never
    propagated into the task group (where they would stop lead delivery)."""
    while True:
        try:
            await task()
            return
        except Exception as exc:  # noqa: BLE001 - isolation is the point; cancellation passes
            log.error("background task %s failed: %s: %s", name, type(exc).__name__, exc,
                      extra={"action": "task.failed", "task": name, "error": type(exc).__name__})
        await anyio.sleep(RESTART_DELAY)


async def _lead_loop(
    worker: DurableWorker,
    settings: LoopSettings,
    shutdown: Shutdown,
    emit: Callable[[CycleSummary], None],
    recovered_at_start: int,
    notifier: Notifier,
    alerts: Alerts | None,
) -> None:
    cycle, failing = 0, False
    heartbeat = Heartbeat(settings.heartbeat)
    while not shutdown.stopping:
        summary = CycleSummary(recovered=recovered_at_start if cycle == 0 else 0)
        poll_changes = 0
        with shutdown.work():
            await deliver.run_cycle(worker.store, worker.port, worker.clock, guard=shutdown,
                                    dispatch_limit=settings.dispatch_limit, summary=summary,
                                    batch_size=settings.batch_size or worker.batch_size,
                                    backoff=worker.backoff)
            if not shutdown.stopping:
                polled = await poll.poll_pass(worker.store, worker.port, worker.clock,
                                              settings.poll_limit, target.TRUSTED)
                summary.polled, summary.poll_failed = polled.polled, polled.failed
                poll_changes = polled.changed + polled.missing
        if not settings.quiet_idle or cycle == 0 or eventful(summary, poll_changes, failing):
            emit(summary)
        else:
            log.debug("idle cycle: nothing moved", extra={"action": "cycle.idle",
                                                          "cycle": cycle + 1})
        failing = summary.poll_failed > 0
        heartbeat.count(summary)
        cycle += 1
        if not shutdown.stopping:  # a cycle cut short by a stop is not progress
            if notifier.enabled:  # no supervisor: nothing to format
                notifier.progressed(_status(cycle, summary))
            if alerts is not None:
                figures = await worker.store.lead_figures()
                alerts.cycle_done(summary, figures, anyio.current_time(), worker.clock.now())
        if settings.cycles is not None and cycle >= settings.cycles:
            return
        await _wait(shutdown, settings.interval, heartbeat, notifier)


async def _wait(
    shutdown: Shutdown, interval: float, heartbeat: Heartbeat, notifier: Notifier
) -> None:
    """Wait ``interval`` seconds between cycles (monotonic), writing heartbeats and
    feeding the supervisor's watchdog when due; returns at once when a stop is asked
    for."""
    end = anyio.current_time() + interval
    while not shutdown.stopping:
        heartbeat.beat_if_due()
        notifier.ping_if_due()
        now = anyio.current_time()
        left = end - now
        if left <= 0:
            return
        await shutdown.sleep(min(left, max(min(heartbeat.due, notifier.next_ping) - now, 0.0)))


async def run(
    worker: DurableWorker,
    settings: LoopSettings,
    emit: Callable[[CycleSummary], None],
    background: Sequence[BackgroundTask] = (),
    services: Sequence[Service] = (),
    started: Callable[[], None] | None = None,
    drain: Drainable | None = None,
    notifier: Notifier | None = None,
    alerts: Alerts | None = None,
) -> int:
    """Run the lead loop (and background tasks, and services) until ``cycles`` or a
    signal.  Returns the exit code.  Raises LockHeld at once if another worker holds the
    lock.  ``started`` is called once the lock is held and recovery is done (``start``'s
    banner).

    ``drain`` (with ``cycles``): after the last lead cycle, the background tasks it
    covers (pipeline workers) finish what is pending before the run ends, for at most
    ``grace`` seconds; a signal ends the drain at once.  Without ``drain``, or when a
    signal ends the run, background tasks are simply cancelled: their work is durable
    and retried (P5), and the next run picks it up.

    ``notifier`` (default: from ``$NOTIFY_SOCKET``) tells a supervisor (systemd) when the
    run is ready, how each cycle went, and when it stops (``runner.io.systemd``).
    ``alerts`` runs the operator's alert command when something needs a person
    (``runner.alerts``); what it queued is sent before the run ends."""
    shutdown = Shutdown(settings.grace)
    notifier = Notifier.from_env() if notifier is None else notifier
    with stop_signals.receiver() as signals:
        try:
            async with deliver.holding_lock(worker.store, worker.port, worker.clock) as recovered, \
                    anyio.create_task_group() as tg:
                tg.start_soon(stop_signals.watch, signals, shutdown, tg,
                              lambda name: notifier.stopping(f"stopping on {name}"))
                if started is not None:
                    started()
                notifier.ready(f"lock held, {recovered} recovered")
                if alerts is not None:
                    alerts.started(anyio.current_time())
                    tg.start_soon(alerts.run_sender)
                    tg.start_soon(_watch_stalls, alerts)
                for name, task in background:
                    tg.start_soon(_isolated, name, task)
                async with anyio.create_task_group() as serving:
                    for service in services:
                        await serving.start(service.run, shutdown)
                    await _lead_loop(worker, settings, shutdown, emit, recovered, notifier,
                                     alerts)
                    if drain is not None and not shutdown.stopping:
                        await _drain(drain, shutdown, settings.grace)
                    for service in services:  # drain what was received, then stop
                        service.stop()
                if not shutdown.stopping:
                    notifier.stopping("the last cycle is done")
                if alerts is not None and not shutdown.hard:
                    with anyio.move_on_after(2 * alerts.settings.timeout):
                        await alerts.flush()
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _unwrap(group) from None
        finally:
            notifier.close()
    return shutdown.exit_code


async def _watch_stalls(alerts: Alerts) -> None:
    """Check for a stalled cycle when one would begin (a task of the run)."""
    while True:
        due = alerts.next_stall_check()
        left = due - anyio.current_time()
        await anyio.sleep(min(max(left, 0.05), alerts.settings.cycle_stall))
        alerts.check_stall(anyio.current_time())


async def _drain(drain: Drainable, shutdown: Shutdown, grace: float) -> None:
    """Let the drained tasks finish their pending work, for at most ``grace`` seconds; a
    signal ends the wait at once (the tasks are then cancelled with the run)."""
    log.info("draining the pipeline workers (at most %gs)", grace,
             extra={"action": "pipeline.draining", "seconds": grace})
    drain.request()
    finished = False
    with anyio.move_on_after(grace):
        async with anyio.create_task_group() as tg:
            async def done() -> None:
                nonlocal finished
                await drain.wait_done()
                finished = True
                tg.cancel_scope.cancel()

            async def stopped() -> None:
                await shutdown.wait_stopped()
                tg.cancel_scope.cancel()

            tg.start_soon(done)
            tg.start_soon(stopped)
    if finished:
        log.info("pipeline workers drained", extra={"action": "pipeline.drained"})
    elif not shutdown.stopping:
        log.warning("the pipeline workers did not drain within %gs; what is pending stays "
                    "for the next run", grace,
                    extra={"action": "pipeline.drain_timeout", "seconds": grace})


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The task group wraps whatever the lead loop raised (a full or unreadable store, …)
    in a group; a lone error is raised as itself, so the CLI maps it to its exit code and
    one clean line instead of a traceback."""
    found = leaves(group)
    return found[0] if len(found) == 1 else group
