"""Pipeline workers as units of work (SPEC K4, P7): alone in the foreground
(``run.py worker``), or as background tasks of ``start``.

In ``start`` each worker is its own task in the loop's task group, on a store connection
of its own, so a slow batch never holds the lead cycle's connection; a failing worker is
logged and started again by the loop, a hung one never delays the lead cycle.  Their
cycles go to the log (stderr), not stdout, which keeps one line per lead cycle.

A lost store (issue 30) is ridden through, alone or in ``start``: the worker reconnects its
store with the command's backoff (``runner.tasks.reconnect``) and starts its cycles
again.  What it had claimed stays claimed under its old fencing token until the lease
runs out (the round that lost the store gives nothing back and completes nothing), then
it is claimable again; a completion under a lost lease is refused by the store, so no
input gets two outcomes, and nothing is lost (at least once, P5).  A job resumes from
the store (the backlog, the outbox range it has read), never forcing a replay twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from runner import signals
from runner.clock import Clock, SystemClock
from runner.pipeline.engine import Registry, WorkerSettings
from runner.pipeline.hotconfig import HotConfig, RetrieverConfig
from runner.pipeline.workers import WORKERS, Drain, Emit, WorkerCycle, run_worker
from runner.signals import Shutdown
from runner.tasks.reconnect import NEVER, ReconnectPolicy, riding_through

if TYPE_CHECKING:
    from runner.store import Store

log = logging.getLogger("runner.pipeline")


def retriever_config(path: str | None, settings: WorkerSettings) -> HotConfig:
    """The raw retriever's configuration: the options as its base, and the file (if any)
    over them, re-read before every batch."""
    base = RetrieverConfig(batch_size=settings.batch_size,
                           poll_interval=settings.poll_interval)
    return HotConfig(path, base)


async def run_worker_until_signalled(
    store: Store, name: str, *, registry: Registry, settings: WorkerSettings,
    clock: Clock, cycles: int | None, config: HotConfig, emit: Emit,
    reconnect: ReconnectPolicy = NEVER,
) -> int:
    """Run a worker in the foreground.  SIGINT/SIGTERM stop it (``runner.signals``): the
    batch in hand is given back at once (its items are claimable again) and the exit code
    is 0; the worker has no send to let finish.  A lost store is ridden through for at
    most ``reconnect.limit`` seconds (a signal meanwhile stops it at once)."""
    shutdown = Shutdown(grace=0.0)
    counted = _Counted(emit)

    async def body() -> None:
        left = None if cycles is None else cycles - counted.cycles
        if left is not None and left <= 0:
            return
        await run_worker(store, name, registry=registry, clock=clock, settings=settings,
                         cycles=left, config=config, emit=counted)

    with signals.receiver() as received:
        # from here on a signal stops the worker gracefully; say so, for supervisors
        log.info("%s started", name, extra={"action": "worker.started", "worker": name})
        async with anyio.create_task_group() as tg:
            tg.start_soon(signals.watch, received, shutdown, tg)
            with shutdown.work():
                await riding_through(store, body, reconnect, what=name)
            tg.cancel_scope.cancel()
    return shutdown.exit_code


class _Counted:
    """An ``Emit`` that counts the cycles it sees (a worker started again after a lost
    store runs only what is left of ``--cycles``)."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.cycles = 0

    def __call__(self, cycle: WorkerCycle) -> None:
        self.cycles += 1
        self.emit(WorkerCycle(cycle.worker, self.cycles, cycle.result))


#: at most one ``pipeline.progress`` line per worker this often (seconds)
PROGRESS_SECONDS = 60.0


class CycleLog:
    """A worker's cycles on stderr, at a bounded rate whatever the load.

    Every cycle is one ``pipeline.cycle`` line at debug level (an idle one included).  At
    info level a worker writes one ``pipeline.progress`` line per ``PROGRESS_SECONDS`` at
    most, with what it claimed since the last one, and none while it claims nothing: on
    PostgreSQL a NOTIFY wakes a worker for every few events, and one info line per cycle
    was ~15,000 lines a minute in a soak.  A refused completion (a lost lease) is a
    warning of its own, from the engine."""

    def __init__(self, worker: str, every: float = PROGRESS_SECONDS) -> None:
        self.worker = worker
        self.every = every
        self.claimed = 0
        self.cycles = 0
        self.since = time.monotonic()

    def __call__(self, cycle: WorkerCycle) -> None:
        result = cycle.result
        log.debug("%s cycle %d: %d claimed", cycle.worker, cycle.cycle, result.claimed,
                  extra={"action": "pipeline.cycle", "worker": cycle.worker,
                         "count": result.claimed})
        if result.claimed:
            self.claimed += result.claimed
            self.cycles += 1
        now = time.monotonic()
        if now - self.since >= self.every:
            if self.claimed:
                log.info("%s: %d claimed in %d cycles over %.0fs", self.worker, self.claimed,
                         self.cycles, now - self.since,
                         extra={"action": "pipeline.progress", "worker": self.worker,
                                "count": self.claimed, "seconds": round(now - self.since)})
            self.claimed = self.cycles = 0
            self.since = now


def drain_for(names: Sequence[str]) -> Drain:
    """A drain over the workers ``names`` (their stages, in stage order)."""
    return Drain([WORKERS[n] for n in names if n in WORKERS])


def pipeline_background_tasks(
    open_store: Callable[[], Awaitable[Store]], names: Sequence[str], *, registry: Registry,
    settings: WorkerSettings,
    config_path: str | None = None, clock: Clock | None = None, drain: Drain | None = None,
    reconnect: ReconnectPolicy = NEVER,
) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
    """``(name, task)`` pairs for the loop's background tasks, one per worker.  With
    ``drain`` (``start --cycles N``), each returns once the drain is requested and its
    stage has nothing pending (``runner.pipeline.workers.Drain``).  Each worker has a
    store connection of its own (``open_store()`` opens it), reconnected after a lost
    store for at most ``reconnect.limit`` seconds."""
    unknown = [n for n in names if n not in WORKERS]
    if unknown:
        raise ValueError(f"unknown worker {unknown[0]!r}")

    def make(name: str) -> Callable[[], Awaitable[None]]:
        async def task() -> None:
            config, emit = retriever_config(config_path, settings), CycleLog(name)
            # the task ends by cancellation: the store's close shields itself
            async with await open_store() as store:
                await riding_through(
                    store, lambda: run_worker(store, name, registry=registry,
                                              clock=clock or SystemClock(),
                                              settings=settings, config=config, emit=emit,
                                              drain=drain),
                    reconnect, what=f"pipeline {name}")
        return task

    return [(f"pipeline {name}", make(name)) for name in names]
