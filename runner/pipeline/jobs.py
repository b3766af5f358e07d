"""The job API (SPEC P7, P8): finite jobs that run until their work is done.

::

    backfill                         re-read an outbox range into D1
    replay-core                      core processing until its backlog is empty
    replay-generic-materialization   generic materialization, likewise
    replay-domain-projection         domain projection, likewise

Replay comes in two kinds, kept distinct:

* **normal** (resume): process the backlog as it is — inputs without a terminal outcome
  under the current processor versions.  A replay that was stopped resumes where the
  store says, not where a cursor says.
* **force** (``force=True``): every input of the stage goes back to the backlog, terminal
  ones too, and is processed again.  Nothing is deleted first: the current outputs and
  outcomes stay current until the new ones are recorded, in the same transaction that
  moves the previous ones into history with their provenance.

A replay job shares the backlog with any worker running the same stage (both claim under
leases), and waits for batches other workers hold until they complete or their leases
run out.  Jobs are separate from workers (``runner.pipeline.workers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.clock import Clock
from runner.pipeline.engine import Registry, RoundResult, WorkerSettings, now_ms, owner_id
from runner.pipeline.model import Stage
from runner.pipeline.port import PipelineStore
from runner.pipeline.progress import NoProgress, Progress
from runner.pipeline.stages import (
    core_processing,
    domain_projection,
    generic_materialization,
    raw_ingestion,
)

JOBS: dict[str, Stage] = {
    raw_ingestion.JOB: raw_ingestion.STAGE,
    core_processing.JOB: core_processing.STAGE,
    generic_materialization.JOB: generic_materialization.STAGE,
    domain_projection.JOB: domain_projection.STAGE,
}
_CLAIM_CYCLES = {
    core_processing.STAGE: core_processing.run_cycle,
    generic_materialization.STAGE: generic_materialization.run_cycle,
    domain_projection.STAGE: domain_projection.run_cycle,
}


@dataclass(frozen=True)
class BackfillRange:
    """The outbox range ``(from_seq, to_seq]``; ``to_seq`` None: the last event now."""

    from_seq: int = 0
    to_seq: int | None = None
    kinds: tuple[str, ...] = raw_ingestion.LEAD_KINDS


async def run_job(
    store: PipelineStore, name: str, *, registry: Registry, clock: Clock,
    settings: WorkerSettings | None = None, force: bool = False,
    progress: Progress | None = None, backfill: BackfillRange | None = None,
) -> dict[str, Any]:
    """Run job ``name`` to the end; returns its summary (the CLI's result line)."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}")
    settings = settings or WorkerSettings()
    progress = progress or NoProgress()
    try:
        if JOBS[name] is Stage.RAW_INGESTION:
            return await _backfill(store, settings, clock, backfill or BackfillRange(),
                                   progress)
        return await _replay(store, name, registry, settings, clock, force, progress)
    finally:
        progress.close()


async def _backfill(store: PipelineStore, settings: WorkerSettings, clock: Clock,
                    span: BackfillRange, progress: Progress) -> dict[str, Any]:
    to_seq = span.to_seq if span.to_seq is not None else await store.outbox_last_seq()
    total = max(to_seq - span.from_seq, 0)
    progress.update(0, total, total)

    def on_batch(_result: RoundResult, at: int) -> None:
        progress.update(at - span.from_seq, total, to_seq - at)

    ingest = raw_ingestion.IngestSettings(settings.batch_size, span.kinds)
    result = await raw_ingestion.backfill(store, ingest, clock, from_seq=span.from_seq,
                                          to_seq=to_seq, on_batch=on_batch)
    progress.update(total, total, 0, final=True)
    return {"job": raw_ingestion.JOB, "from_seq": span.from_seq, "to_seq": to_seq,
            "read": result.claimed, **result.outcomes}


async def _replay(store: PipelineStore, name: str, registry: Registry,
                  settings: WorkerSettings, clock: Clock, force: bool,
                  progress: Progress) -> dict[str, Any]:
    stage = JOBS[name]
    refs = [p.ref for p in registry.for_stage(stage)]
    await store.register_processors(refs, now_ms(clock))
    requeued = 0
    for ref in refs:
        requeued += await store.sync_backlog(ref, now_ms(clock), force=force)
    pending = sum((await store.backlog(refs)).values())
    total, done = pending, 0
    summary = RoundResult()
    owner = owner_id(name)
    progress.update(done, total, pending)
    async with store.wakeups(stage) as wake:
        while True:
            result = await _CLAIM_CYCLES[stage](store, registry, owner, settings, clock)
            summary.add(result)
            if not result.refused:
                done += result.claimed
            if result.claimed < settings.batch_size:
                pending = sum((await store.backlog(refs)).values())
                total = max(total, done + pending)
                progress.update(done, total, pending)
                if pending == 0:
                    break
                if result.claimed == 0:  # held by another worker, or backing off
                    await wake.wait(settings.poll_interval)
            else:
                progress.update(done, total, max(total - done, 0))
    progress.update(done, total, 0, final=True)
    return {"job": name, "force": force, "requeued": requeued if force else 0,
            "processed": summary.claimed, "outcomes": summary.outcomes,
            "refused": summary.refused, "pending": 0}
