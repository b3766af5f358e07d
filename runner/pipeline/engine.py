"""The processing engine (SPEC P2, P4, P5, P10): processors, their registry, and one
claim-process-complete round.

A processor is code with an identity (name, version, capability) and a stage; it turns a
batch of inputs into one :class:`~runner.pipeline.model.Outcome` each.  It must be a
function of its inputs: the same input may be processed twice (its worker died before
completing), and the store makes a second write of the same outputs change nothing.

Register your own in code::

    from runner.pipeline.engine import processor
    from runner.pipeline.plugins import default_registry
    from runner.pipeline.model import Output, Stage, output, not_applicable

    @processor("word-count", version=1, stage=Stage.CORE_PROCESSING, capability="count")
    def word_count(item):
        text = item.payload.get("text")
        if not isinstance(text, str):
            return not_applicable()
        return output(Output(f"words:{item.key}", {"words": len(text.split())}))

    registry = default_registry()
    registry.register(word_count)

and on the command line with ``--plugin MODULE`` (a module whose ``register(registry)``
adds its processors).

A round claims a batch under a lease, processes it while a renewal task extends the
lease every third of its duration, and completes it in one transaction.  If the lease is
lost meanwhile, processing is abandoned and the completion is never attempted; if it is
lost between the last renewal and the completion, the store refuses the completion and
writes nothing.  Either way the batch is someone else's now.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from runner.clock import Clock
from runner.pipeline.model import (
    MAX_DELAY_SECONDS,
    Claim,
    Completion,
    Item,
    LeaseLost,
    Outcome,
    ProcessorRef,
    Stage,
    failed,
)
from runner.pipeline.port import PipelineStore

log = logging.getLogger("runner.pipeline")


class Processor:
    """Base class: set ``ref`` and implement :meth:`process` (a whole batch at once, on
    the event loop: it must not block) or :meth:`process_one` (one input at a time, a
    plain blocking function).

    The ``process_one`` calls of a batch run in a worker thread, so a slow one cannot
    starve the lease renewal that runs on the loop meanwhile (a batch slower than its
    lease would otherwise lose its claim at every round and never finish)."""

    ref: ProcessorRef

    async def process(self, items: Sequence[Item]) -> Sequence[Outcome]:
        return await anyio.to_thread.run_sync(self._all, items)

    def _all(self, items: Sequence[Item]) -> list[Outcome]:
        return [self._one(item) for item in items]

    def process_one(self, item: Item) -> Outcome:
        raise NotImplementedError

    def _one(self, item: Item) -> Outcome:
        try:
            return self.process_one(item)
        except Exception as exc:  # noqa: BLE001 - a processor bug is a retryable failure
            return failed(f"{type(exc).__name__}: {exc}", retryable=True)


class FunctionProcessor(Processor):
    def __init__(self, ref: ProcessorRef, fn: Callable[[Item], Outcome]) -> None:
        self.ref = ref
        self._fn = fn

    def process_one(self, item: Item) -> Outcome:
        return self._fn(item)


def processor(
    name: str, *, version: int, stage: Stage, capability: str,
    rebacklog_on_version_bump: bool = True,
) -> Callable[[Callable[[Item], Outcome]], FunctionProcessor]:
    """Make a processor of a function ``item -> Outcome``."""
    if stage is Stage.RAW_INGESTION:
        raise ValueError("raw ingestion reads a source, not inputs: use a claim stage")
    ref = ProcessorRef(name, version, stage, capability, rebacklog_on_version_bump)

    def wrap(fn: Callable[[Item], Outcome]) -> FunctionProcessor:
        return FunctionProcessor(ref, fn)

    return wrap


class Registry:
    """The processors a worker or job runs, one version per name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Processor] = {}

    def register(self, proc: Processor) -> Processor:
        ref = proc.ref
        if ref.version < 1 or not ref.name or ref.stage is Stage.RAW_INGESTION:
            raise ValueError(f"bad processor identity {ref!r}")
        self._by_name[ref.name] = proc
        return proc

    def for_stage(self, stage: Stage) -> list[Processor]:
        return [p for p in self._by_name.values() if p.ref.stage is stage]

    def refs(self) -> list[ProcessorRef]:
        return [p.ref for p in self._by_name.values()]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 300.0

    def __post_init__(self) -> None:
        # a delay is at most backoff_max_seconds: within the clock horizon
        if self.backoff_seconds < 0 or not 0 <= self.backoff_max_seconds <= MAX_DELAY_SECONDS:
            raise ValueError(f"backoffs must be between 0 and {MAX_DELAY_SECONDS:g} s")

    def delay_ms(self, attempts: int) -> int:
        delay = self.backoff_seconds * 2 ** max(attempts - 1, 0)
        return int(min(delay, self.backoff_max_seconds) * 1000)


@dataclass(frozen=True)
class WorkerSettings:
    """Per-worker tuning (P10)."""

    batch_size: int = 100
    concurrency: int = 1
    poll_interval: float = 1.0
    lease_seconds: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not 0 < self.lease_seconds <= MAX_DELAY_SECONDS:
            raise ValueError(f"lease_seconds must be in (0, {MAX_DELAY_SECONDS:g}]")

    @property
    def lease_ms(self) -> int:
        return max(int(self.lease_seconds * 1000), 1)


@dataclass
class RoundResult:
    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    refused: bool = False

    def add(self, other: RoundResult) -> None:
        self.claimed += other.claimed
        self.refused = self.refused or other.refused
        for kind, n in other.outcomes.items():
            self.outcomes[kind] = self.outcomes.get(kind, 0) + n


def now_ms(clock: Clock) -> int:
    return int(clock.now().timestamp() * 1000)


def owner_id(worker: str, lane: int = 0) -> str:
    return f"{worker}/{socket.gethostname().split('.')[0]}/{os.getpid()}/{lane}"


def completions(claim: Claim, outcomes: Sequence[Outcome], retry: RetryPolicy,
                at_ms: int) -> list[Completion]:
    """Decide each item's next state: terminal, or pending again after a backoff for a
    retryable failure that has attempts left."""
    if len(outcomes) != len(claim.items):
        bug = failed(f"processor returned {len(outcomes)} outcomes for "
                     f"{len(claim.items)} inputs", retryable=False)
        outcomes = [bug] * len(claim.items)
    out = []
    for item, outcome in zip(claim.items, outcomes, strict=True):
        again = (outcome.kind == "failed" and outcome.retryable
                 and item.attempts < retry.max_attempts)
        out.append(Completion(
            item.work_id, item.input_id, outcome, "pending" if again else "done",
            at_ms + retry.delay_ms(item.attempts) if again else at_ms))
    return out


async def _process(proc: Processor, items: Sequence[Item]) -> Sequence[Outcome]:
    try:
        return await proc.process(items)
    except Exception as exc:  # noqa: BLE001 - a failing batch is a retryable failure
        return [failed(f"{type(exc).__name__}: {exc}", retryable=True)] * len(items)


async def process_under_lease(store: PipelineStore, proc: Processor, claim: Claim,
                              settings: WorkerSettings, clock: Clock) -> Sequence[Outcome]:
    """Process a claimed batch while renewing its lease; raises LeaseLost if a renewal
    finds it gone (processing is then abandoned)."""
    result: list[Sequence[Outcome]] = []
    lost: list[LeaseLost] = []

    async def renew(scope: anyio.CancelScope) -> None:
        while True:
            await anyio.sleep(settings.lease_seconds / 3)
            try:
                await store.renew(claim, settings.lease_ms, now_ms(clock))
            except LeaseLost as exc:
                lost.append(exc)
                scope.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(renew, tg.cancel_scope)
        result.append(await _process(proc, claim.items))
        tg.cancel_scope.cancel()
    if lost:
        raise lost[0]
    return result[0]


async def run_round(store: PipelineStore, proc: Processor, owner: str,
                    settings: WorkerSettings, clock: Clock,
                    before_complete: Callable[[Claim], Awaitable[None]] | None = None,
                    ) -> RoundResult:
    """One claim-process-complete round of one processor."""
    claim = await store.claim(proc.ref, owner, settings.batch_size, settings.lease_ms,
                              now_ms(clock))
    result = RoundResult(claimed=len(claim.items))
    if not claim.items:
        return result
    done = False
    try:
        outcomes = await process_under_lease(store, proc, claim, settings, clock)
        if before_complete is not None:
            await before_complete(claim)
        finished = completions(claim, outcomes, settings.retry, now_ms(clock))
        await store.complete(claim, finished, now_ms(clock))
        done = True
    except LeaseLost as exc:
        done = True  # nothing of ours is left to give back
        log.warning("%s", exc.message, extra={"action": "pipeline.lease_lost",
                    "worker": owner, "count": len(claim.items)})
        result.refused = True
        return result
    finally:
        if not done:  # cancelled or failed before completing: give the batch back now
            with (anyio.CancelScope(shield=True), anyio.move_on_after(5),
                  contextlib.suppress(Exception)):
                await store.release(claim, now_ms(clock))
    for c in finished:
        result.outcomes[c.outcome.kind] = result.outcomes.get(c.outcome.kind, 0) + 1
    return result


async def claim_cycle(stage: Stage, store: PipelineStore, registry: Registry, owner: str,
                      settings: WorkerSettings, clock: Clock) -> RoundResult:
    """One cycle of a claim stage: each of its processors runs one round."""
    total = RoundResult()
    for proc in registry.for_stage(stage):
        total.add(await run_round(store, proc, owner, settings, clock))
    return total
