"""Lead commands: ``accept`` and ``status`` (SPEC L3, L13)."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from runner.commands.common import (
    check_paths,
    clock_from,
    common_options,
    emit,
    intake_store,
    number,
    require_sync_option,
    say_error,
)
from runner.errors import BadInputError, UsageError
from runner.io.stores import open_store
from runner.limits import MAX_SHOWN, UNCERTAIN_SHOWN
from runner.storedata import is_postgres

if TYPE_CHECKING:
    from runner.clock import Clock
    from runner.leads import intake
    from runner.leads.models import Scope
    from runner.store import IntakeStore
    from runner.storedata import GivenScope


def register(sub: argparse._SubParsersAction[Any]) -> None:
    accept = sub.add_parser(
        "accept", parents=[common_options(scope="required", target="optional")],
        help="durably accept one event (answers after the commit)")
    what = accept.add_mutually_exclusive_group(required=True)
    what.add_argument("--record", help="event.json, or - for stdin")
    what.add_argument("--records", metavar="FILE",
                      help="NDJSON, one event per line (- for stdin): one answer per line, "
                           "in order, each after its commit; records are committed in groups")
    require_sync_option(accept, "accept exits 78")
    accept.set_defaults(handler=cmd_accept)

    status = sub.add_parser(
        "status", parents=[common_options(scope="optional", target="optional")],
        help="print the store's state as JSON (no lock, changes nothing)")
    status.add_argument(
        "--records", nargs="?", const="all", metavar="all|STATE", type=record_choice,
        help="instead of the document, every record (or those in STATE) as NDJSON, one "
             "per line in accept order, streamed")
    status.add_argument(
        "--shown", type=number(int, 0, MAX_SHOWN), default=UNCERTAIN_SHOWN, metavar="N",
        help=f"how many of the oldest uncertain records the document shows "
             f"(default {UNCERTAIN_SHOWN})")
    status.set_defaults(handler=cmd_status)


def record_choice(value: str) -> str:
    """An argparse ``type`` for ``--records``: ``all`` or a state's name."""
    from runner.status import record_state

    try:
        record_state(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return value


def load_scope(path: str) -> Scope:
    from runner.jsonio import read_json_object
    from runner.leads.models import validate_scope

    return validate_scope(read_json_object(path, what="scope file"))


def load_given_scope(path: str, db: str) -> Scope | GivenScope:
    """The scope file of a delivery command (``once``, ``start``, ``observe``,
    ``poll-status``): read, not validated, if ``db`` is a SQLite store that exists
    (opening it validates a scope that is not the pinned one, and the worker one it needs
    validated: ``runner.storedata.GivenScope``); validated now otherwise, so that an
    invalid scope never creates a store."""
    from runner.jsonio import read_json_object
    from runner.storedata import GivenScope, is_postgres

    if is_postgres(db) or not os.path.isfile(db):
        return load_scope(path)
    return GivenScope(read_json_object(path, what="scope file"))


def read_record(path: str) -> dict[str, Any]:
    from runner.jsonio import MAX_DOCUMENT_BYTES, parse_object, read_json_object

    if path == "-":
        return parse_object(sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1), what="record")
    return read_json_object(path, what="record file")


async def cmd_accept(args: argparse.Namespace) -> int:
    from runner.leads import intake

    check_paths(args)
    clock = clock_from(args)
    if args.records is not None:
        return await _accept_records(args, clock)
    data: dict[str, Any] | None = None
    try:
        scope = load_scope(args.scope)
        data = read_record(args.record)
        intake.prepare(data, scope)  # validate before the store is touched
    except BadInputError as exc:
        return _rejected(args, intake.rejected(data, exc))
    async with await open_store(args.db, scope=scope) as store:
        writes = intake_store(store, args.require_synchronous_replication)
        result = await intake.accept(writes, clock, scope, data)
    if not result.ok:
        return _rejected(args, result)
    emit(result.to_json())
    return 0


async def _accept_records(args: argparse.Namespace, clock: Clock) -> int:
    from runner.commands.bulk import accept_records, open_records
    from runner.leads.intake import Intake

    scope = load_scope(args.scope)  # refused: {"result": "refused"} on stdout, exit 65
    fd = open_records(args.records)
    try:
        async with await open_store(args.db, scope=scope) as store, AsyncExitStack() as lanes:
            writes = intake_store(store, args.require_synchronous_replication)

            async def open_lane() -> IntakeStore:
                other = await lanes.enter_async_context(
                    await open_store(args.db, scope=scope, create=False))
                return intake_store(other, args.require_synchronous_replication)

            return await accept_records(args, Intake(writes, clock, scope), fd,
                                        open_lane if is_postgres(args.db) else None)
    finally:
        if args.records != "-":
            os.close(fd)


def _rejected(args: argparse.Namespace, result: intake.AcceptResult) -> int:
    emit(result.to_json())
    say_error(args, f"rejected: {result.message}", result.reason or "rejected")
    return result.exit_code


async def cmd_status(args: argparse.Namespace) -> int:
    from runner.status import record_state, write_records, write_status

    check_paths(args)
    scope = load_scope(args.scope) if args.scope else None
    async with await open_store(args.db, scope=scope, create=False) as store:
        if args.records is not None:
            await write_records(store, sys.stdout.write, state=record_state(args.records))
        else:
            await write_status(store, sys.stdout.write, shown=args.shown)
    sys.stdout.flush()
    return 0
