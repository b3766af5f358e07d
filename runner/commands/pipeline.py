"""Staged processing commands (SPEC P3, P7, P8, P10): ``worker``, ``job``, ``backlog``,
``pipeline prune``.

``worker NAME`` prints one JSON line per cycle; ``job NAME`` shows progress on stderr (a
bar on a terminal, JSON lines otherwise) and prints one result line; ``backlog`` prints
the backlog per stage and processor version; ``pipeline prune --before AGE|TIME``
removes what is finished and older than the cutoff (``runner.pipeline.retention``) and
prints what it removed.  The pipeline modules are imported only when one of these
commands runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from runner.commands.common import (
    Parser,
    clock_from,
    common_options,
    emit,
    number,
    plugin_option,
    reconnect_option,
    reconnect_policy,
)
from runner.io.stores import open_store

if TYPE_CHECKING:
    from runner.pipeline.engine import Registry, WorkerSettings

WORKER_NAMES = ("raw-retriever", "core-processor", "generic-materializer", "domain-projector")
JOB_NAMES = ("backfill", "replay-core", "replay-generic-materialization",
             "replay-domain-projection")


def tuning_options() -> Parser:
    """Per-worker settings (P10), shared by ``worker``, ``job`` and ``start``."""
    parent = Parser(add_help=False)
    parent.add_argument("--batch-size", type=number(int, 1, 10_000), default=100,
                        metavar="N", help="inputs per claim (default 100)")
    parent.add_argument("--concurrency", type=number(int, 1, 64), default=1, metavar="N",
                        help="batches in flight at once per worker (default 1)")
    parent.add_argument("--poll-interval", type=number(float, 0.01, 3600), default=1.0,
                        metavar="S", help="seconds between polls when idle (default 1)")
    parent.add_argument("--lease", type=number(float, 0.1, 86_400), default=30.0,
                        metavar="S", help="lease duration in seconds, renewed every "
                                          "third of it while a batch runs (default 30)")
    parent.add_argument("--max-attempts", type=number(int, 1, 1000), default=5,
                        metavar="N", help="attempts before a retryable failure is final "
                                          "(default 5)")
    parent.add_argument("--backoff", type=number(float, 0, 86_400), default=1.0,
                        metavar="S", help="first retry delay, doubled each attempt "
                                          "(default 1, at most 300)")
    plugin_option(parent, "import MODULE and call its register(registry) to add processors")
    return parent


def register(sub: argparse._SubParsersAction[Any]) -> None:
    tuning = tuning_options()
    worker = sub.add_parser(
        "worker", parents=[common_options(), tuning],
        help="run one pipeline worker in the foreground (a cycle = one claim-process-"
             "complete round)")
    worker.add_argument("name", choices=WORKER_NAMES)
    worker.add_argument("--cycles", type=number(int, 1, 10**9), metavar="N",
                        help="stop after N cycles (default: run until signalled)")
    worker.add_argument("--retriever-config", metavar="FILE",
                        help="raw-retriever: its JSON config file, re-read before every "
                             "batch (batch_size, kinds, poll_interval)")
    reconnect_option(worker, what="the worker")
    worker.set_defaults(handler=cmd_worker)

    job = sub.add_parser("job", parents=[common_options(), tuning],
                         help="run one pipeline job until its work is done")
    job.add_argument("name", choices=JOB_NAMES)
    job.add_argument("--force", action="store_true",
                     help="replay: recompute terminal inputs too (previous results are "
                          "kept as history)")
    job.add_argument("--from-seq", type=number(int, 0, 2**62), default=0, metavar="SEQ",
                     help="backfill: read outbox events after SEQ (default 0)")
    job.add_argument("--to-seq", type=number(int, 0, 2**62), metavar="SEQ",
                     help="backfill: up to SEQ (default: the last event now)")
    job.add_argument("--kinds", metavar="K,K",
                     help="backfill: event kinds to ingest (default accepted,"
                          "state_changed,status_changed)")
    reconnect_option(job, what="the job")
    job.set_defaults(handler=cmd_job)

    backlog = sub.add_parser(
        "backlog", parents=[common_options()],
        help="print pending inputs per stage and processor version (changes nothing)")
    plugin_option(backlog, "count the processors MODULE registers too")
    backlog.set_defaults(handler=cmd_backlog)

    pipeline = sub.add_parser(
        "pipeline", help="the pipeline's retention: prune finished records and old history")
    verbs = pipeline.add_subparsers(dest="verb", required=True, parser_class=type(pipeline))
    prune = verbs.add_parser(
        "prune", parents=[common_options()],
        help="remove D1-D3 records that are finished and older than --before (with their "
             "work rows and history), and history older than it; never a merged record, "
             "D4, an input still in a backlog, claimed or leased, or a D1 record whose "
             "outbox event is kept (prune the outbox first)")
    prune.add_argument("--before", required=True, metavar="AGE|TIME",
                       help="the cutoff: an age (90s, 15m, 12h, 7d) before now, or an "
                            "ISO-8601 time with a timezone")
    prune.add_argument("--dry-run", action="store_true",
                       help="print what would be removed now, and remove nothing")
    prune.add_argument("--batch", type=number(int, 1, 1_000_000), metavar="N",
                       help="records per level per round, one transaction each "
                            "(default 2000)")
    prune.set_defaults(handler=cmd_prune)


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    from runner.pipeline.engine import RetryPolicy, WorkerSettings

    return WorkerSettings(
        batch_size=args.batch_size, concurrency=args.concurrency,
        poll_interval=args.poll_interval, lease_seconds=args.lease,
        retry=RetryPolicy(max_attempts=args.max_attempts, backoff_seconds=args.backoff))


def registry_from(args: argparse.Namespace) -> Registry:
    from runner.pipeline.plugins import default_registry

    return default_registry(args.plugin)


async def cmd_worker(args: argparse.Namespace) -> int:
    from runner.commands.candidates import require_store
    from runner.pipeline.workers import WorkerCycle
    from runner.tasks.pipeline import retriever_config, run_worker_until_signalled

    settings = settings_from(args)
    registry = registry_from(args)
    config = retriever_config(args.retriever_config, settings)
    await require_store(args.db)
    def show(cycle: WorkerCycle) -> None:
        # every cycle of a finite run; an endless one skips idle cycles (no line a second)
        if args.cycles is not None or cycle.result.claimed or cycle.result.refused:
            emit(cycle.to_json())

    async with await open_store(args.db) as store:
        return await run_worker_until_signalled(
            store, args.name, registry=registry, settings=settings, clock=clock_from(args),
            cycles=args.cycles, config=config, emit=show, reconnect=reconnect_policy(args))


def _kinds(value: str | None) -> tuple[str, ...]:
    from runner.errors import UsageError
    from runner.pipeline.stages.raw_ingestion import LEAD_KINDS

    if value is None:
        return LEAD_KINDS
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    if not kinds:
        raise UsageError("job: --kinds names no kind")
    return kinds


async def cmd_job(args: argparse.Namespace) -> int:
    from runner.commands.candidates import require_store
    from runner.pipeline.jobs import BackfillRange, JobRun, run_job
    from runner.pipeline.progress import Progress
    from runner.tasks.reconnect import riding_through

    settings = settings_from(args)
    registry = registry_from(args)
    span = BackfillRange(args.from_seq, args.to_seq, _kinds(args.kinds))
    await require_store(args.db)
    run = JobRun()  # what the job did, kept if the store is lost and the job resumes
    async with await open_store(args.db) as store:
        result = await riding_through(
            store, lambda: run_job(store, args.name, registry=registry,
                                   clock=clock_from(args), settings=settings,
                                   force=args.force, progress=Progress(args.name),
                                   backfill=span, run=run),
            reconnect_policy(args), what=args.name)
    emit(result)
    return 0


async def cmd_backlog(args: argparse.Namespace) -> int:
    from runner.pipeline.report import backlog_document

    registry = registry_from(args)
    async with await open_store(args.db, create=False) as store, store.reading():
        doc = await backlog_document(store, registry.refs())
    emit(doc)
    return 0


async def cmd_prune(args: argparse.Namespace) -> int:
    from runner.clock import to_text
    from runner.commands.candidates import require_store
    from runner.pipeline.retention import parse_cutoff

    now = clock_from(args).now()
    cutoff = parse_cutoff(args.before, now)
    await require_store(args.db)
    async with await open_store(args.db) as store:
        result = await store.prune_pipeline(int(cutoff.timestamp() * 1000), to_text(now),
                                            dry_run=args.dry_run, batch=args.batch)
    emit(result.to_json())
    return 0
