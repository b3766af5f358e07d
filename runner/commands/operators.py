"""Operator commands (SPEC E5, issue 19): ``uncertain`` lists uncertain records, ``resolve``
records an operator's decision on one of them (``runner.tasks.resolve``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.commands.common import (
    Parser,
    check_paths,
    clock_from,
    common_options,
    emit,
    number,
)
from runner.io.stores import describe_location, open_store, store_exists
from runner.limits import BATCH_SIZE_RANGE, DEFAULT_BATCH_SIZE

if TYPE_CHECKING:
    from datetime import datetime

    from runner.clock import Clock
    from runner.leads.port import CRMRecordPort
    from runner.store import Store
    from runner.storedata import UncertainRow

#: records read per page while listing
PAGE = 500


def register(sub: argparse._SubParsersAction[Any]) -> None:
    uncertain = sub.add_parser(
        "uncertain", parents=[common_options(scope="optional")],
        help="list uncertain records: write_id, key, age, attempts, the last readback in "
             "words (no lock, changes nothing)")
    uncertain.set_defaults(handler=cmd_uncertain)

    resolve = sub.add_parser(
        "resolve", parents=[common_options(scope="optional", target="optional")],
        help="record an operator's decision on one uncertain record (--write-id), or on "
             "every one whose fresh readback is conclusive (--all): confirmed (the row is "
             "there) or not-sent (after a fresh readback that finds no row, the record is "
             "sent again)")
    which = resolve.add_mutually_exclusive_group(required=True)
    which.add_argument("--write-id", metavar="W",
                       help="the uncertain record's write_id (see 'runner uncertain')")
    which.add_argument("--all", dest="resolve_all", action="store_true",
                       help="every uncertain record (in-flight ones are made uncertain "
                            "first) whose fresh readback, in chunks, is conclusive: no row "
                            "for not-sent, exactly one equal row for confirmed; the others "
                            "are left alone and listed with why (needs --target)")
    low, high = BATCH_SIZE_RANGE
    resolve.add_argument("--batch-size", type=number(int, low, high),
                         default=DEFAULT_BATCH_SIZE, metavar="N",
                         help=f"with --all: records per readback request and per commit "
                              f"({low}-{high}, default {DEFAULT_BATCH_SIZE}; at most the "
                              "adapter's max_batch); a single --write-id is one record")
    resolve.add_argument("--as", dest="resolve_as", required=True,
                         choices=["confirmed", "not-sent"],
                         help="confirmed: you verified the row in the target (with --all: "
                              "runner reads it back and finds it equal); not-sent: the "
                              "original request can no longer arrive (needs --target)")
    resolve.add_argument("--reason", required=True, metavar="TEXT",
                         help="why: kept with the decision and its outbox event (1-1000 "
                              "characters; never put contact details here)")
    resolve.add_argument("--dry-run", action="store_true",
                         help="make every check (and the readback) and say what would "
                              "happen; change nothing")
    resolve.set_defaults(handler=cmd_resolve)

    target = sub.add_parser(
        "target", help="operator decisions about the target (adopt)")
    what = target.add_subparsers(dest="target_command", required=True, parser_class=Parser)
    adopt = what.add_parser(
        "adopt", parents=[common_options(scope="optional", target="required")],
        help="record that this store replaces the store whose batch marks the target "
             "keeps (a store restored, emptied or made again): the next run raises the "
             "target's fence for this store and reads every record back, by write_id "
             "and by key, before anything is sent (SPEC E8)")
    adopt.add_argument("--reason", required=True, metavar="TEXT",
                       help="why: kept with the decision and its outbox event (1-1000 "
                            "characters; never put contact details here)")
    adopt.set_defaults(handler=cmd_target_adopt)


def uncertain_json(row: UncertainRow, now: datetime) -> dict[str, Any]:
    from runner.clock import from_text
    from runner.leads.port import readback_in_words

    age = (max(0, int((now - from_text(row.uncertain_since)).total_seconds()))
           if row.uncertain_since else None)
    return {"write_id": row.write_id, "source_lead_id": row.source_lead_id,
            "uncertain_since": row.uncertain_since, "age_seconds": age,
            "attempts": row.attempts, "reconcile_attempts": row.reconcile_attempts,
            "last_reconcile": row.last_reconcile, "last_reconcile_at": row.last_reconcile_at,
            "last_reconcile_words": readback_in_words(row.last_reconcile,
                                                      row.reconcile_attempts),
            "last_error": row.last_error, "last_failure": row.last_failure}


async def write_uncertain(store: Store, now: datetime, write: Callable[[str], object]) -> None:
    """``{"records": [...], "count": n}`` as one line, in accept order, streamed page by
    page from one consistent read."""
    from runner.jsonio import dumps_line

    async with store.reading():
        write('{"records":[')
        after, count = 0, 0
        while page := await store.uncertain_records(after, PAGE):
            for row in page:
                write(("," if count else "") + dumps_line(uncertain_json(row, now)))
                count += 1
            after = page[-1].seq
        write('],"count":' + str(count) + "}\n")


async def cmd_uncertain(args: argparse.Namespace) -> int:
    from runner.commands.leads import load_scope

    scope = load_scope(args.scope) if args.scope else None
    now = clock_from(args).now()
    async with await open_store(args.db, scope=scope, create=False) as store:
        await write_uncertain(store, now, sys.stdout.write)
    sys.stdout.flush()
    return 0


async def cmd_resolve(args: argparse.Namespace) -> int:
    """Under the worker lock: a resolve never runs beside a worker (exit 75 while one
    runs), so no reconcile or dispatch can come between its readback and its commit.
    Refused by the lock, it says that nothing was resolved (the lock's own message says
    "not starting", which is a worker's word)."""
    from runner.errors import LockHeld

    try:
        return await _resolve(args)
    except LockHeld as exc:
        message = exc.message.removesuffix("; not starting")
        raise type(exc)(f"{message}; nothing was resolved",
                        holder_pid=exc.holder_pid) from None


async def _resolve(args: argparse.Namespace) -> int:
    from runner.commands.leads import load_scope
    from runner.errors import StoreNotFound
    from runner.tasks.resolve import check_reason, resolve

    check_paths(args)
    check_reason(args.reason)  # before anything is opened
    scope = load_scope(args.scope) if args.scope else None
    if not await store_exists(args.db):
        raise StoreNotFound(f"no store at {describe_location(args.db)}")
    # a target is named by --target, or by --target-adapter alone (its factory gets None)
    named = args.target is not None or getattr(args, "target_adapter", None) is not None
    if not named and (args.resolve_as == "not-sent" or args.resolve_all):
        from runner.errors import RuleViolation

        if args.resolve_all:
            raise RuleViolation("--all needs --target: runner reads every record back "
                                "before it decides it", reason="target_required",
                                detail={"as": args.resolve_as})
        raise RuleViolation("--as not-sent needs --target: runner reads the target back "
                            "before it lets a record be sent again", reason="target_required",
                            detail={"write_id": args.write_id})
    probe_lock(args.db)
    clock = clock_from(args)
    target = None
    try:
        port = None
        if named:
            from runner.commands.common import open_target
            from runner.leads.port import CRMRecordPort

            target = open_target(args)
            port = CRMRecordPort(target) if target is not None else None
        # a writing command: a store at an older schema is upgraded (as 'once' does)
        async with await open_store(args.db, scope=scope) as store, store.worker_lock():
            if args.resolve_all:
                assert port is not None  # --all needs --target (checked above)
                return await resolve_all_until_signalled(store, port, clock, args)
            result = await resolve(store, port, clock, args.write_id, args.resolve_as,
                                   args.reason, dry_run=args.dry_run)
    finally:
        if target is not None:
            from runner.io.targets.compose import close_adapter

            close_adapter(target)
    emit(result.to_json())
    return 0


async def cmd_target_adopt(args: argparse.Namespace) -> int:
    """Under the worker lock: check the target (pinned, or pinnable), read its mark, and
    record the adoption of its owner; nothing is sent and no record changes here."""
    from runner.commands.common import open_target
    from runner.commands.leads import load_scope
    from runner.errors import RuleViolation, StoreNotFound
    from runner.io.targets.compose import close_adapter
    from runner.leads.port import CRMRecordPort
    from runner.tasks import target as checks
    from runner.tasks.resolve import check_reason

    check_paths(args)
    check_reason(args.reason)
    scope = load_scope(args.scope) if args.scope else None
    if not await store_exists(args.db):
        raise StoreNotFound(f"no store at {describe_location(args.db)}")
    probe_lock(args.db)
    clock = clock_from(args)
    adapter = open_target(args)
    if adapter is None:
        raise RuleViolation("target adopt needs --target", reason="target_required")
    try:
        port = CRMRecordPort(adapter)
        async with await open_store(args.db, scope=scope) as store, store.worker_lock():
            await checks.check_for_writes(store, port, clock)  # an HTTP target says here
            if not port.marks:
                raise RuleViolation("this target keeps no batch marks: there is no owner "
                                    "to adopt (see 'High availability and restores' for "
                                    "what a target without marks cannot catch)",
                                    reason="target_keeps_no_marks")
            own = await store.store_mark()
            held = await port.read_mark()
            if held.owner is None or held.owner == own.store_id:
                emit({"adopted": None, "store_id": own.store_id,
                      "why": "the target keeps no batch of another store; nothing to adopt"})
                return 0
            await store.adopt_target(held.owner, await store.pinned_target(), args.reason,
                                     clock.now())
    finally:
        close_adapter(adapter)
    emit({"adopted": held.owner, "store_id": own.store_id,
          "next": "the next run raises the target's fence for this store and reads every "
                  "record back before anything is sent"})
    return 0


#: seconds a chunk's commit may take to finish after a first SIGINT/SIGTERM
COMMIT_GRACE = 30.0


async def resolve_all_until_signalled(store: Store, port: CRMRecordPort, clock: Clock,
                                      args: argparse.Namespace) -> int:
    """``resolve --all`` under the worker lock, stopped by SIGINT/SIGTERM between chunks
    (``runner.signals``): a first signal abandons a readback in progress (its chunk stays
    uncertain) or lets a commit in progress finish, then the answer is printed and the exit
    code is 0; a second one stops at once (130/143; a chunk not yet committed is rolled
    back).  The answer is printed either way, with what was committed."""
    import anyio

    from runner import signals
    from runner.tasks.resolve import ResolveAllResult, resolve_all

    shutdown = signals.Shutdown(COMMIT_GRACE)
    result = ResolveAllResult(args.resolve_as, args.dry_run)
    with signals.receiver() as received:
        async with anyio.create_task_group() as tg:
            tg.start_soon(signals.watch, received, shutdown, tg)
            await resolve_all(store, port, clock, args.resolve_as, args.reason,
                              chunk_size=args.batch_size, dry_run=args.dry_run,
                              guard=shutdown, result=result)
            tg.cancel_scope.cancel()
    if shutdown.hard:
        result.stopped = True
    emit(result.to_json())
    return shutdown.exit_code


def probe_lock(db: str) -> None:
    """A live worker refuses a SQLite resolve at once, before the store is opened (the
    lock itself is taken after, and held to the end)."""
    from runner.storedata import is_postgres

    if not is_postgres(db):
        from runner.io.filelock import probe

        probe(db)
