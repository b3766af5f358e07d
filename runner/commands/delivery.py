"""Delivery commands: ``once``, ``start``, ``observe``, ``poll-status`` (SPEC L8-L13).

Their options (faults, sizes, quotas, backoff, alerts) are defined in
``runner/commands/delivery_options.py``."""

from __future__ import annotations

import argparse
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from runner.commands.common import (
    MAX_COUNT,
    MAX_SECONDS,
    check_paths,
    clock_from,
    common_options,
    emit,
    number,
    open_target,
    plugin_option,
    reconnect_option,
    reconnect_policy,
)
from runner.commands.delivery_options import (
    PIPELINE_CHOICES,
    alert_options,
    alert_settings,
    batch_option,
    fault_option,
    poll_option,
    rate_option,
    retry_options,
)
from runner.commands.leads import load_given_scope, read_record
from runner.errors import UsageError
from runner.jsonio import read_json_object

if TYPE_CHECKING:
    from runner import loop
    from runner.pipeline.workers import Drain
    from runner.replication import Replication
    from runner.store import Store
    from runner.tasks.outcomes import CycleSummary
    from runner.worker import DurableWorker


def register(sub: argparse._SubParsersAction[Any]) -> None:
    faults = ("inject a fault into every target call of the run: outage, timeout, "
              "crash-after-write, crash-before-write, read-error, rate-limited (the target "
              "keeps a quota of 2 writes a second and answers rate limited over it), slow "
              "(every call takes 0.2 s more); or crash-at:POINT[@N] to exit 73 at the "
              "N-th pass through a named crash point")
    once = sub.add_parser(
        "once", parents=[common_options(scope="required", target="required")],
        help="run one cycle (recover, reconcile, dispatch, poll pass); print its summary")
    fault_option(once, faults)
    poll_option(once)
    once.add_argument("--dispatch-limit", type=number(int, 1, MAX_COUNT), metavar="N",
                      help="send at most N records per cycle (default: all)")
    batch_option(once)
    rate_option(once)
    retry_options(once)
    alert_options(once)
    once.set_defaults(handler=cmd_once)

    start = sub.add_parser(
        "start", parents=[common_options(scope="required", target="required")],
        help="run cycles in the foreground until --cycles or SIGINT/SIGTERM")
    fault_option(start, faults)
    poll_option(start)
    start.add_argument("--dispatch-limit", type=number(int, 1, MAX_COUNT), metavar="N",
                       help="send at most N records per cycle (default: all)")
    batch_option(start)
    rate_option(start)
    retry_options(start)
    start.add_argument("--interval", type=number(float, 0, MAX_SECONDS), default=5.0,
                       metavar="S",
                       help="seconds to wait between cycles (default 5)")
    start.add_argument("--cycles", type=number(int, 1, MAX_COUNT), metavar="N",
                       help="stop after N cycles, printing a summary for each (default: "
                            "run until signalled, printing the first cycle and then only "
                            "cycles where something happened)")
    start.add_argument("--heartbeat", type=number(float, 0, MAX_SECONDS), default=300.0,
                       metavar="S",
                       help="log a heartbeat line every S seconds while cycles complete "
                            "(default 300; 0: none)")
    start.add_argument("--grace", type=number(float, 0, MAX_SECONDS), default=30.0,
                       metavar="S",
                       help="seconds a send in flight may take to finish after the first "
                            "signal (default 30)")
    start.add_argument("--sweep-interval", type=number(float, 1, MAX_SECONDS), default=300.0,
                       metavar="S",
                       help="run the candidate lifecycle sweep at start and then every S "
                            "seconds of UTC wall time (default 300)")
    start.add_argument("--workers", metavar="NAME,...",
                       help="pipeline workers to run as background tasks: raw-retriever, "
                            "core-processor, generic-materializer, domain-projector (with "
                            "--cycles, they drain what is pending after the last cycle, "
                            "for at most --grace seconds)")
    start.add_argument("--retriever-config", metavar="FILE",
                       help="the raw retriever's JSON config file (re-read before every "
                            "batch)")
    plugin_option(start, "import MODULE and call its register(registry)")
    reconnect_option(start)
    alert_options(start)
    from runner.commands.serve import health_option, listen_options

    listen_options(start, required=False)
    health_option(start)
    start.set_defaults(handler=cmd_start)

    observe = sub.add_parser(
        "observe", parents=[common_options(scope="required", target="optional")],
        help="store the latest status snapshot of a confirmed record")
    observe.add_argument("--record", required=True, help="the record's event.json")
    observe.add_argument("--snapshot", required=True,
                         help='snapshot.json: {"status": ...}, or {"missing": true}')
    observe.set_defaults(handler=cmd_observe)

    poll_status = sub.add_parser(
        "poll-status", parents=[common_options(scope="required", target="required")],
        help="run one bounded status poll pass over confirmed records")
    fault_option(poll_status, "read-error: make every status read fail; slow: every read "
                               "takes 0.2 s more; or crash-at:POINT[@N] (a poll.* crash "
                               "point)")
    poll_option(poll_status)
    rate_option(poll_status, writes=False)
    poll_status.set_defaults(handler=cmd_poll_status)


@asynccontextmanager
async def open_worker(args: argparse.Namespace) -> AsyncIterator[DurableWorker]:
    """The store, the synthetic target (with any faults) and the worker, from options."""
    from runner import crashpoints
    from runner.io.faults import FaultyAdapter, crash_point_option, parse_faults
    from runner.io.targets.compose import close_adapter
    from runner.leads.pacing import DEFAULT_RETRY_BASE, DEFAULT_RETRY_CAP
    from runner.leads.port import CRMAdapter, CRMRecordPort
    from runner.worker import DurableWorker

    check_paths(args)
    scope = load_given_scope(args.scope, args.db)
    faults = parse_faults(getattr(args, "fault", None))
    crash_at = crash_point_option(getattr(args, "fault", None))
    armed: AbstractContextManager[None] = (
        crashpoints.armed(*crashpoints.parse_option(crash_at)) if crash_at else nullcontext())
    target = open_target(args)
    adapter: CRMAdapter | None = target
    if target is not None and faults:
        adapter = FaultyAdapter(target, faults)
    retry = getattr(args, "retry_base", None), getattr(args, "retry_cap", None)
    if retry[0] is not None and retry[1] is not None and retry[0] > retry[1]:
        raise UsageError(f"--retry-base ({retry[0]:g}s) must not exceed --retry-cap "
                         f"({retry[1]:g}s)")
    try:
        port = CRMRecordPort(adapter) if adapter is not None else None
        with armed:  # --fault crash-at: wins over $RUNNER_CRASH_AT
            async with DurableWorker(
                    args.db, scope, port, clock=clock_from(args),
                    target_rate=getattr(args, "target_rate", None),
                    target_read_rate=getattr(args, "target_read_rate", None),
                    retry_base=retry[0] if retry[0] is not None else DEFAULT_RETRY_BASE,
                    retry_cap=retry[1] if retry[1] is not None else DEFAULT_RETRY_CAP,
                    dispatch_pipeline=PIPELINE_CHOICES[getattr(args, "dispatch_pipeline",
                                                               "auto")],
            ) as worker:
                yield worker
    finally:
        if target is not None:
            close_adapter(target)


def _emit_cycle(summary: CycleSummary) -> None:
    emit(summary.to_json())


async def _run(
    args: argparse.Namespace,
    settings: loop.LoopSettings,
    background: Sequence[loop.BackgroundTask] = (),
    started: Callable[[Replication], None] | None = None,
    drain: loop.Drainable | None = None,
) -> int:
    from runner import loop
    from runner.errors import StoreError, TargetUnavailable

    options = None
    if getattr(args, "listen", None) is not None:
        from runner.commands.serve import http_options

        options = http_options(args)  # bad secrets, a public address: before anything
    elif getattr(args, "require_synchronous_replication", False):
        raise UsageError("start: --require-synchronous-replication is for an intake: give "
                         "--listen (or use it with accept or serve)")
    alerting = alert_settings(args)
    alerts = None
    if alerting is not None:
        from runner.alerts import Alerts

        alerts = Alerts(alerting)
    _probe_lock(args)
    try:
        async with open_worker(args) as worker:
            replication = await worker.store.replication() if started else None
            begun = None if started is None or replication is None else functools.partial(
                started, replication)
            if options is None:
                return await loop.run(worker, settings, _emit_cycle, background,
                                      started=begun, drain=drain, alerts=alerts)
            from runner.commands.serve import build_service

            service = build_service(options, worker, mode="start", grace=settings.grace,
                                    interval=settings.interval)

            def emit_and_count(summary: CycleSummary) -> None:
                service.on_cycle(summary)
                _emit_cycle(summary)

            return await loop.run(worker, settings, emit_and_count, background, [service],
                                  started=begun, drain=drain, alerts=alerts)
    except StoreError as exc:
        if alerts is not None and not isinstance(exc, TargetUnavailable):
            import anyio

            with anyio.CancelScope(shield=True):
                await alerts.send_now(alerts.store_failed(exc.reason, exc.message))
        raise


def _probe_lock(args: argparse.Namespace) -> None:
    """A live worker refuses us at once, before the store is touched: a worker stopped
    inside a commit holds the store, not the lock file."""
    from runner.storedata import is_postgres

    if not is_postgres(args.db):
        from runner.io.filelock import probe

        probe(args.db)


def log_banner(args: argparse.Namespace, replication: Replication) -> None:
    """``start``'s one start-up line, once the lock is held and recovery is done: what
    runs, on what, as which process, under which replication guarantee (and a warning
    when an acknowledgement can be lost: ``runner.replication.announce``).  The store is
    described, never echoed (a DSN may carry a password)."""
    import logging
    import os

    from runner import __version__
    from runner.io.stores import describe_location
    from runner.io.targets.pgtable.names import describe_target
    from runner.replication import announce
    from runner.storedata import is_postgres

    scope = load_given_scope(args.scope, args.db).model_dump()  # checked by the worker
    fields = [str(scope[name]) for name in ("tenant_id", "account_id", "page_id", "form_id")]
    logging.getLogger("runner.loop").info(
        "runner %s started", __version__,
        extra={"action": "runner.started", "version": __version__, "pid": os.getpid(),
               "store": describe_location(args.db) if is_postgres(args.db) else args.db,
               "scope": "/".join(fields),
               "target": describe_target(args.target, getattr(args, "target_table", None)),
               "interval": args.interval, "replication": replication.mode,
               "heartbeat": args.heartbeat, "workers": args.workers or "none"})
    announce(replication)


async def cmd_once(args: argparse.Namespace) -> int:
    from runner import loop

    return await _run(args, loop.LoopSettings(
        cycles=1, interval=0, poll_limit=args.poll_limit, dispatch_limit=args.dispatch_limit,
        batch_size=args.batch_size))


async def cmd_start(args: argparse.Namespace) -> int:
    from runner import loop
    from runner.tasks.sweep import sweep_background_task

    policy = reconnect_policy(args)
    sweep = sweep_background_task(background_opener(args.db), interval=args.sweep_interval,
                                  clock=clock_from(args), reconnect=policy)
    # with --cycles, the pipeline workers drain what is pending before the run ends
    drain = _drain(args) if args.cycles is not None else None
    code = await _run(args, loop.LoopSettings(
        cycles=args.cycles, interval=args.interval, poll_limit=args.poll_limit,
        grace=args.grace, dispatch_limit=args.dispatch_limit, batch_size=args.batch_size,
        quiet_idle=args.cycles is None, heartbeat=args.heartbeat or None, reconnect=policy),
        [sweep, *_pipeline_tasks(args, drain)], started=functools.partial(log_banner, args),
        drain=drain)
    _log_stopped(code)
    return code


def _log_stopped(code: int) -> None:
    """``start``'s last line when it ends as asked (its cycles done, or a signal): a
    failure ends with its error line instead."""
    import logging

    logging.getLogger("runner.loop").info(
        "runner stopped%s", f" at once (exit {code})" if code else "",
        extra={"action": "runner.stopped", "reason": "hard_stop" if code else "done"})


def background_opener(db: str) -> Callable[[], Awaitable[Store]]:
    """Opens a background task's own store connection (a small page cache).  Never
    creates one: the run's worker opened (and made) the store before any background task
    starts, and a task started again after a failover to a server without the store must
    be refused, not given an empty store."""
    from runner.io.stores import open_store
    from runner.limits import BACKGROUND_CACHE_KIB

    return functools.partial(open_store, db, create=False, cache_kib=BACKGROUND_CACHE_KIB)


def _worker_names(args: argparse.Namespace) -> list[str]:
    from runner.commands.pipeline import WORKER_NAMES

    names = [n.strip() for n in args.workers.split(",") if n.strip()]
    wrong = [n for n in names if n not in WORKER_NAMES]
    if wrong or not names or len(set(names)) != len(names):
        raise UsageError(f"start: --workers takes distinct names among "
                         f"{', '.join(WORKER_NAMES)}")
    return names


def _drain(args: argparse.Namespace) -> Drain | None:
    if not args.workers:
        return None
    from runner.tasks.pipeline import drain_for

    return drain_for(_worker_names(args))


def _pipeline_tasks(args: argparse.Namespace, drain: Drain | None = None
                    ) -> list[loop.BackgroundTask]:
    """``start --workers``: each pipeline worker as a background task of its own."""
    if not args.workers:
        return []
    from runner.pipeline.engine import WorkerSettings
    from runner.pipeline.plugins import default_registry
    from runner.tasks.pipeline import pipeline_background_tasks

    return pipeline_background_tasks(background_opener(args.db), _worker_names(args),
                                     registry=default_registry(args.plugin),
                                     settings=WorkerSettings(),
                                     config_path=args.retriever_config, drain=drain,
                                     reconnect=reconnect_policy(args))


async def cmd_observe(args: argparse.Namespace) -> int:
    record = read_record(args.record)
    snapshot = read_json_object(args.snapshot, what="snapshot file")
    async with open_worker(args) as worker:
        result = await worker.observe(record, snapshot)
    emit({"result": result, "source_lead_id": record.get("source_lead_id")})
    return 0


def check_poll_faults(values: Sequence[str] | None) -> None:
    """``poll-status`` reads and never sends: a fault that could only act on a send (or a
    crash point it never passes) would be accepted and do nothing, so it is refused."""
    from runner.io.faults import CRASH_AT, Fault, crash_point_option, parse_faults

    idle = sorted(parse_faults(values) - {Fault.READ_ERROR, Fault.SLOW})
    if idle:
        raise UsageError(f"poll-status: --fault {', '.join(idle)} does not apply to polling "
                         "(poll-status takes read-error, slow or crash-at:poll.*)")
    crash_at = crash_point_option(values)
    if crash_at and not crash_at.removeprefix(CRASH_AT).startswith("poll."):
        raise UsageError(f"poll-status: --fault {crash_at} is never reached by a poll pass "
                         "(poll-status takes crash-at:poll.*)")


async def cmd_poll_status(args: argparse.Namespace) -> int:
    check_poll_faults(args.fault)
    async with open_worker(args) as worker:
        summary = await worker.poll(args.poll_limit)
    emit(summary.to_json())
    if summary.polled and summary.failed == summary.polled:
        from runner.errors import PollFailed

        raise PollFailed(f"every status read of the pass failed ({summary.failed} of "
                         f"{summary.polled}); the last snapshots are kept, and 'status' "
                         "shows the failure under poll_health")
    return 0
