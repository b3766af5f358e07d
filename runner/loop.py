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
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from runner.tasks.deliver import CycleSummary
from runner.worker import DurableWorker

log = logging.getLogger("runner.loop")

BackgroundTask = tuple[str, Callable[[], Awaitable[None]]]


class Service(Protocol):
    """A server run from the task group (``start --listen``): started once the lock is
    held, asked to ``stop`` (drain, bounded by its own grace) when the cycles end, and
    cancelled at once by a hard stop."""

    async def run(self, shutdown: Shutdown, *, task_status: TaskStatus[None]) -> None: ...

    def stop(self) -> None: ...
#: pause before a crashed background task is started again
RESTART_DELAY = 5.0


@dataclass(frozen=True)
class LoopSettings:
    cycles: int | None = None  # None: until signalled
    interval: float = 5.0
    poll_limit: int = 100
    grace: float = 30.0
    dispatch_limit: int | None = None


class Shutdown:
    """Signal state of a run, and the :class:`runner.tasks.deliver.SendGuard` of its sends."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.stopping = False
        self.hard = False
        self.signum: int | None = None
        self._stopped = anyio.Event()
        self._send_scope: anyio.CancelScope | None = None
        self._send_done = anyio.Event()
        self._work_scope: anyio.CancelScope | None = None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.hard and self.signum else 0

    @contextmanager
    def shield(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope(shield=True) as scope:
            self._send_scope, self._send_done = scope, anyio.Event()
            if self.hard:
                scope.cancel()
            try:
                yield scope
            finally:
                self._send_scope = None
                self._send_done.set()

    @contextmanager
    def work(self) -> Iterator[anyio.CancelScope]:
        """The scope of one cycle or poll pass: cancelled at once by a graceful stop when
        no send is in flight (then only reads are interrupted)."""
        with anyio.CancelScope() as scope:
            self._work_scope = scope
            try:
                yield scope
            finally:
                self._work_scope = None

    def on_signal(self, signum: int, tg: TaskGroup) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        if self.stopping:
            log.warning("second %s: stopping at once", name,
                        extra={"action": "runner.hard_stop", "signal": name})
            self._hard_stop(tg)
            return
        self.stopping = True
        self._stopped.set()
        if self._send_scope is not None:
            log.warning("%s: letting the send in flight finish (grace %ss)", name, self.grace,
                        extra={"action": "runner.stopping", "signal": name})
            tg.start_soon(self._grace_timer, tg)
        else:
            log.warning("%s: stopping", name, extra={"action": "runner.stopping", "signal": name})
            if self._work_scope is not None:
                self._work_scope.cancel()

    async def _grace_timer(self, tg: TaskGroup) -> None:
        with anyio.move_on_after(self.grace):
            await self._send_done.wait()
            return
        log.warning("grace of %ss ran out: stopping at once", self.grace,
                    extra={"action": "runner.hard_stop", "reason": "grace"})
        self._hard_stop(tg)

    def _hard_stop(self, tg: TaskGroup) -> None:
        self.hard = True
        if self._send_scope is not None:
            self._send_scope.cancel()
        tg.cancel_scope.cancel()

    async def sleep(self, seconds: float) -> None:
        """Wait between cycles; returns at once when a stop is asked for."""
        with anyio.move_on_after(seconds):
            await self._stopped.wait()


async def _watch_signals(signals: AsyncIterator[int], shutdown: Shutdown, tg: TaskGroup) -> None:
    async for signum in signals:
        shutdown.on_signal(signum, tg)


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
) -> None:
    cycle = 0
    while not shutdown.stopping:
        summary = CycleSummary(recovered=recovered_at_start if cycle == 0 else 0)
        with shutdown.work():
            await worker.run_cycle(summary=summary, guard=shutdown,
                                   dispatch_limit=settings.dispatch_limit)
            if not shutdown.stopping:
                summary.polled = (await worker.poll(settings.poll_limit)).polled
        emit(summary)
        cycle += 1
        if settings.cycles is not None and cycle >= settings.cycles:
            return
        await shutdown.sleep(settings.interval)


async def run(
    worker: DurableWorker,
    settings: LoopSettings,
    emit: Callable[[CycleSummary], None],
    background: Sequence[BackgroundTask] = (),
    services: Sequence[Service] = (),
) -> int:
    """Run the lead loop (and background tasks, and services) until ``cycles`` or a
    signal.  Returns the exit code.  Raises LockHeld at once if another worker holds the
    lock."""
    shutdown = Shutdown(settings.grace)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with worker.hold_lock() as recovered, anyio.create_task_group() as tg:
                tg.start_soon(_watch_signals, signals, shutdown, tg)
                for name, task in background:
                    tg.start_soon(_isolated, name, task)
                async with anyio.create_task_group() as serving:
                    for service in services:
                        await serving.start(service.run, shutdown)
                    await _lead_loop(worker, settings, shutdown, emit, recovered)
                    for service in services:  # drain what was received, then stop
                        service.stop()
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _unwrap(group) from None
    return shutdown.exit_code


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The task group wraps whatever the lead loop raised (a full or unreadable store, …)
    in a group; a lone error is raised as itself, so the CLI maps it to its exit code and
    one clean line instead of a traceback."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group
