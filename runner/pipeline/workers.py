"""The worker API (SPEC P7, P10): continuous workers, one per stage.

::

    raw-retriever          raw ingestion: tails the lead outbox into D1
    core-processor         core processing: D1 -> D2
    generic-materializer   generic materialization: D2 -> D3
    domain-projector       domain projection: D3 -> D4

A worker runs cycles until cancelled (or ``cycles`` of them): a cycle is one
claim-process-complete round (for the raw retriever, one batch of the tail).  After a
cycle that found nothing it waits for a wake-up or its poll interval.  With
``concurrency`` N, N rounds run at once, each with its own claim.

A worker may be killed at any line: what it had claimed becomes claimable when the lease
runs out, and the next worker processes it again (at-least-once; the writes are
idempotent).  On cancellation a worker gives back the batch it holds at once.

Workers are kept apart from jobs (``runner.pipeline.jobs``): a worker never ends by
itself, a job ends when its work is done.  The one exception is a *drain*
(:class:`Drain`, ``start --cycles N --workers …``): once asked, the workers of one run
finish what is pending in stage order and then return.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from runner.clock import Clock, to_text
from runner.pipeline.engine import Registry, RoundResult, WorkerSettings, now_ms, owner_id
from runner.pipeline.hotconfig import HotConfig
from runner.pipeline.model import Stage
from runner.pipeline.port import PipelineStore
from runner.pipeline.stages import (
    core_processing,
    domain_projection,
    generic_materialization,
    raw_ingestion,
)

log = logging.getLogger("runner.pipeline")

WORKERS: dict[str, Stage] = {
    raw_ingestion.WORKER: raw_ingestion.STAGE,
    core_processing.WORKER: core_processing.STAGE,
    generic_materialization.WORKER: generic_materialization.STAGE,
    domain_projection.WORKER: domain_projection.STAGE,
}
_CLAIM_CYCLES = {
    core_processing.STAGE: core_processing.run_cycle,
    generic_materialization.STAGE: generic_materialization.run_cycle,
    domain_projection.STAGE: domain_projection.run_cycle,
}
#: how often an idle claim worker re-checks that every input has its work row (a
#: safety net for a processor registered while inputs were being written elsewhere)
RESYNC_SECONDS = 60.0


@dataclass
class WorkerCycle:
    worker: str
    cycle: int
    result: RoundResult

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "cycle": self.cycle, "claimed": self.result.claimed,
                "outcomes": self.result.outcomes, "refused": self.result.refused}


@dataclass
class _Budget:
    cycles: int | None
    started: int = 0
    results: list[RoundResult] = field(default_factory=list)

    def take(self) -> int | None:
        if self.cycles is not None and self.started >= self.cycles:
            return None
        self.started += 1
        return self.started


Emit = Callable[[WorkerCycle], None]


class Drain:
    """The workers of one run finish what is pending, in stage order, then return.

    Once :meth:`request` is called (``start --cycles N``, after its last lead cycle), a
    worker returns after a cycle that *began* with the drain requested and every upstream
    worker of this run already finished, and that found nothing more to take (the raw
    retriever: a batch short of full, the tail caught up; a claim worker: nothing
    claimed).  So the raw retriever finishes first, then the core processor, and so on;
    a stage whose upstream worker is not in this run only waits for its own backlog.
    What stays pending (leased elsewhere, waiting on a retry delay, or written after the
    request by another process) is left for the next run: it is durable.
    """

    def __init__(self, stages: list[Stage]) -> None:
        self.requested = anyio.Event()
        self._done = {stage: anyio.Event() for stage in stages}

    def request(self) -> None:
        self.requested.set()

    def ready(self, stage: Stage) -> bool:
        """Whether a cycle of ``stage`` starting now may be this worker's last."""
        order = list(Stage)
        return self.requested.is_set() and all(
            event.is_set() for upstream, event in self._done.items()
            if order.index(upstream) < order.index(stage))

    def finish(self, stage: Stage) -> None:
        if stage in self._done:
            self._done[stage].set()

    async def wait_done(self) -> None:
        """Until every worker of the run has finished."""
        for event in self._done.values():
            await event.wait()


async def _idle(wake: Any, seconds: float, drain: Drain | None) -> None:
    """Wait for a wake-up or ``seconds``; a drain request ends the wait at once."""
    if drain is None:
        await wake.wait(seconds)
        return
    async with anyio.create_task_group() as tg:
        async def first(waiter: Callable[[], Any]) -> None:
            await waiter()
            tg.cancel_scope.cancel()

        tg.start_soon(first, lambda: wake.wait(seconds))
        tg.start_soon(first, drain.requested.wait)


def _ignore(_cycle: WorkerCycle) -> None:
    return None


async def run_worker(
    store: PipelineStore, name: str, *, registry: Registry, clock: Clock,
    settings: WorkerSettings | None = None, cycles: int | None = None,
    config: HotConfig | None = None, emit: Emit = _ignore, drain: Drain | None = None,
) -> int:
    """Run worker ``name`` until cancelled, ``cycles`` cycles, or the end of a ``drain``;
    returns cycles run."""
    if name not in WORKERS:
        raise ValueError(f"unknown worker {name!r}")
    settings = settings or WorkerSettings()
    budget = _Budget(cycles)
    if WORKERS[name] is Stage.RAW_INGESTION:
        await _run_retriever(store, config or _default_config(settings), clock, budget, emit,
                             drain)
    else:
        await _run_claims(store, name, registry, settings, clock, budget, emit, drain)
    if drain is not None:
        drain.finish(WORKERS[name])
    return budget.started


def _default_config(settings: WorkerSettings) -> HotConfig:
    from runner.pipeline.hotconfig import RetrieverConfig

    return HotConfig(None, RetrieverConfig(batch_size=settings.batch_size,
                                           poll_interval=settings.poll_interval))


async def _run_retriever(store: PipelineStore, config: HotConfig, clock: Clock,
                         budget: _Budget, emit: Emit, drain: Drain | None = None) -> None:
    name = raw_ingestion.WORKER
    gaps = raw_ingestion.Gaps()
    async with store.wakeups(Stage.RAW_INGESTION) as wake:
        while (cycle := budget.take()) is not None:
            last_one = drain is not None and drain.ready(Stage.RAW_INGESTION)
            if config.reload():  # the next batch runs with what the file says now
                await store.record_worker_config(config.view(to_text(clock.now())))
                if config.error:
                    log.warning("%s", config.error, extra={
                        "action": "pipeline.config_invalid", "worker": name})
            result = await raw_ingestion.run_cycle(store, config.effective.ingest, clock, gaps)
            emit(WorkerCycle(name, cycle, result))
            if result.claimed < config.effective.batch_size:
                if last_one:
                    return  # drained: the tail was caught up after the drain request
                if not _last(budget):
                    await _idle(wake, config.effective.poll_interval, drain)


def _last(budget: _Budget) -> bool:
    return budget.cycles is not None and budget.started >= budget.cycles


async def _run_claims(store: PipelineStore, name: str, registry: Registry,
                      settings: WorkerSettings, clock: Clock, budget: _Budget,
                      emit: Emit, drain: Drain | None = None) -> None:
    stage = WORKERS[name]
    run_cycle = _CLAIM_CYCLES[stage]
    procs = registry.for_stage(stage)
    await store.register_processors([p.ref for p in procs], now_ms(clock))
    for proc in procs:
        await store.sync_backlog(proc.ref, now_ms(clock))
    synced = time.monotonic()

    async def lane(index: int) -> None:
        nonlocal synced
        owner = owner_id(name, index)
        async with store.wakeups(stage) as wake:
            while (cycle := budget.take()) is not None:
                last_one = drain is not None and drain.ready(stage)
                result = await run_cycle(store, registry, owner, settings, clock)
                emit(WorkerCycle(name, cycle, result))
                if result.claimed == 0 and last_one:
                    return  # drained: nothing left to claim after its upstream finished
                if result.claimed == 0 and not _last(budget):
                    if time.monotonic() - synced > RESYNC_SECONDS:
                        synced = time.monotonic()
                        for proc in procs:
                            await store.sync_backlog(proc.ref, now_ms(clock))
                    await _idle(wake, settings.poll_interval, drain)

    async with anyio.create_task_group() as tg:
        for index in range(max(settings.concurrency, 1)):
            tg.start_soon(lane, index)
