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

The lead loop itself, and how it rides through a lost store (issue 30), is
``runner.cycles``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio

from runner import signals as stop_signals
from runner.alerts import Alerts
from runner.cycles import LeadLoop, LoopSettings, Service
from runner.errors import leaves
from runner.io.systemd import Notifier
from runner.signals import Shutdown
from runner.tasks import reconnect
from runner.tasks.outcomes import CycleSummary
from runner.worker import DurableWorker

__all__ = ["BackgroundTask", "Drainable", "LoopSettings", "Service", "run"]

log = logging.getLogger("runner.loop")

BackgroundTask = tuple[str, Callable[[], Awaitable[None]]]


class Drainable(Protocol):
    """Background tasks that can finish their pending work and return (the pipeline
    workers' ``runner.pipeline.workers.Drain``)."""

    def request(self) -> None: ...

    async def wait_done(self) -> None: ...


#: pause before a crashed background task is started again
RESTART_DELAY = 5.0


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
            async with reconnect.tenure(worker.store, worker.port, worker.clock) as tenure, \
                    anyio.create_task_group() as tg:
                recovered = tenure.recovered
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
                    await LeadLoop(worker, settings, shutdown, emit, tenure, notifier,
                                   alerts, services).run()
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
