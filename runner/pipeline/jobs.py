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

A job run again after its store was lost (``runner.tasks.pipeline``) passes the same
:class:`JobRun`: it resumes where the store says, counts what it did before, forces a
replay's processors at most once each (a force already committed is not forced again:
that would recompute what the first pass already finished) and reads a backfill's
range on from the last batch it read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class JobRun:
    """What a job has done so far, kept across runs of it in one command (a lost store:
    ``runner.tasks.pipeline``)."""

    #: the labels of the processors whose force replay has committed
    forced: set[str] = field(default_factory=set)
    requeued: int = 0
    summary: RoundResult = field(default_factory=RoundResult)
    done: int = 0
    #: a backfill: the range's end, fixed at the first run, and the last seq read
    to_seq: int | None = None
    after: int | None = None


async def run_job(
    store: PipelineStore, name: str, *, registry: Registry, clock: Clock,
    settings: WorkerSettings | None = None, force: bool = False,
    progress: Progress | None = None, backfill: BackfillRange | None = None,
    run: JobRun | None = None,
) -> dict[str, Any]:
    """Run job ``name`` to the end; returns its summary (the CLI's result line).  ``run``
    carries what an earlier run of the same job did (see :class:`JobRun`)."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}")
    settings = settings or WorkerSettings()
    progress = progress or NoProgress()
    run = run if run is not None else JobRun()
    try:
        if JOBS[name] is Stage.RAW_INGESTION:
            return await _backfill(store, settings, clock, backfill or BackfillRange(),
                                   progress, run)
        return await _replay(store, name, registry, settings, clock, force, progress, run)
    finally:
        progress.close()


async def _backfill(store: PipelineStore, settings: WorkerSettings, clock: Clock,
                    span: BackfillRange, progress: Progress, run: JobRun) -> dict[str, Any]:
    if run.to_seq is None:
        run.to_seq = span.to_seq if span.to_seq is not None else await store.outbox_last_seq()
    to_seq = run.to_seq
    total = max(to_seq - span.from_seq, 0)
    start = run.after if run.after is not None else span.from_seq
    progress.update(start - span.from_seq, total, to_seq - start)

    def on_batch(result: RoundResult, at: int) -> None:
        run.after = at
        run.summary.add(result)
        progress.update(at - span.from_seq, total, to_seq - at)

    ingest = raw_ingestion.IngestSettings(settings.batch_size, span.kinds)
    await raw_ingestion.backfill(store, ingest, clock, from_seq=start, to_seq=to_seq,
                                 on_batch=on_batch)
    progress.update(total, total, 0, final=True)
    result = run.summary
    return {"job": raw_ingestion.JOB, "from_seq": span.from_seq, "to_seq": to_seq,
            "read": result.claimed, **result.outcomes}


async def _replay(store: PipelineStore, name: str, registry: Registry,
                  settings: WorkerSettings, clock: Clock, force: bool,
                  progress: Progress, run: JobRun) -> dict[str, Any]:
    stage = JOBS[name]
    refs = [p.ref for p in registry.for_stage(stage)]
    await store.register_processors(refs, now_ms(clock))
    for ref in refs:
        again = force and ref.label not in run.forced
        count = await store.sync_backlog(ref, now_ms(clock), force=again)
        if again:
            run.forced.add(ref.label)
            run.requeued += count
    requeued = run.requeued
    pending = sum((await store.backlog(refs)).values())
    total, done = run.done + pending, run.done
    summary = run.summary
    owner = owner_id(name)
    progress.update(done, total, pending)
    async with store.wakeups(stage) as wake:
        while True:
            result = await _CLAIM_CYCLES[stage](store, registry, owner, settings, clock)
            summary.add(result)
            if not result.refused:
                done += result.claimed
                run.done = done
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
