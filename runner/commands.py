"""Command handlers: parse files, open the store, call the library, print one JSON line.

Each handler returns an exit code; errors are raised as ``RunnerError`` and mapped by
``runner.cli.main``.  Handlers stay thin: the work is in ``runner.intake``, ``runner.status``
and the tasks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runner import intake, logs
from runner.clock import Clock, FixedClock, SystemClock, parse_now
from runner.errors import BadInputError, UsageError
from runner.io.fsguard import same_file
from runner.jsonio import MAX_DOCUMENT_BYTES, dumps_line, parse_object, read_json_object
from runner.models import Scope, validate_scope
from runner.status import write_status
from runner.store import is_postgres, open_store


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(dumps_line(doc) + "\n")
    sys.stdout.flush()


def say_error(args: argparse.Namespace, message: str, reason: str) -> None:
    print(logs.error_line(message, fmt=args.log_format, reason=reason), file=sys.stderr)


def clock_from(args: argparse.Namespace) -> Clock:
    return FixedClock(parse_now(args.now)) if getattr(args, "now", None) else SystemClock()


def check_paths(args: argparse.Namespace) -> None:
    """``--db`` and ``--target`` naming one file would let the target corrupt the store."""
    target = getattr(args, "target", None)
    if target and not is_postgres(args.db) and same_file(args.db, target):
        raise UsageError("--db and --target name the same file; use two separate files")


def load_scope(path: str) -> Scope:
    return validate_scope(read_json_object(path, what="scope file"))


def read_record(path: str) -> dict[str, Any]:
    if path == "-":
        return parse_object(sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1), what="record")
    return read_json_object(path, what="record file")


async def cmd_accept(args: argparse.Namespace) -> int:
    check_paths(args)
    clock = clock_from(args)
    data: dict[str, Any] | None = None
    try:
        scope = load_scope(args.scope)
        data = read_record(args.record)
        intake.prepare(data, scope)  # validate before the store is touched
    except BadInputError as exc:
        return _rejected(args, intake.rejected(data, exc))
    async with await open_store(args.db, scope=scope) as store:
        result = await intake.accept(store, clock, scope, data)
    if not result.ok:
        return _rejected(args, result)
    emit(result.to_json())
    return 0


def _rejected(args: argparse.Namespace, result: intake.AcceptResult) -> int:
    emit(result.to_json())
    say_error(args, f"rejected: {result.message}", result.reason or "rejected")
    return result.exit_code


async def cmd_status(args: argparse.Namespace) -> int:
    check_paths(args)
    scope = load_scope(args.scope) if args.scope else None
    async with await open_store(args.db, scope=scope, create=False) as store:
        await write_status(store, sys.stdout.write)
    sys.stdout.flush()
    return 0
