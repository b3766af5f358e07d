"""Stopping on a signal, one way for every foreground command (SPEC K4).

The first SIGINT/SIGTERM asks for a stop: work in a ``Shutdown.work()`` scope is cancelled
at once, unless a send is in flight (inside ``Shutdown.shield()``), which may finish for
``grace`` seconds.  A second signal, or the grace running out, cancels everything (exit
128 + signal).  ``receiver()`` installs both handlers explicitly, so a process that
inherited SIGINT as ignored (a background job of a non-interactive shell) still stops on
it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio
from anyio.abc import TaskGroup

log = logging.getLogger("runner.loop")


def receiver() -> AbstractContextManager[AsyncIterator[int]]:
    """SIGINT and SIGTERM as an async iterator (handlers installed explicitly)."""
    return anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)


class Shutdown:
    """Signal state of a run, and the :class:`runner.tasks.pagerun.SendGuard` of its sends."""

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

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

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
            log.info("%s: letting the send in flight finish (grace %ss)", name, self.grace,
                     extra={"action": "runner.stopping", "signal": name})
            tg.start_soon(self._grace_timer, tg)
        else:
            # a deliberate stop is no warning (a second signal, or a grace that ran out, is)
            log.info("%s: stopping", name, extra={"action": "runner.stopping", "signal": name})
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


async def watch(
    signals: AsyncIterator[int], shutdown: Shutdown, tg: TaskGroup,
    on_stop: Callable[[str], None] | None = None,
) -> None:
    """Feed the signals to ``shutdown`` (a task of ``tg``); ``on_stop`` hears the first
    one's name."""
    async for signum in signals:
        first = not shutdown.stopping
        shutdown.on_signal(signum, tg)
        if first and on_stop is not None:
            on_stop(signal.Signals(signum).name)
