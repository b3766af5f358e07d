"""Helpers shared by the command modules: output, options, clock, paths."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from runner import logs
from runner.clock import Clock, FixedClock, SystemClock, parse_now
from runner.errors import UsageError
from runner.storedata import is_postgres


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('runner ')}: {message}")


def common_options(*, scope: str = "none", target: str = "none") -> Parser:
    """Options shared by commands.  ``scope``/``target``: ``required|optional|none``."""
    parent = Parser(add_help=False)
    parent.add_argument("--db", required=True,
                        help="the store: a SQLite file path (or a postgresql:// DSN)")
    if scope != "none":
        parent.add_argument("--scope", required=scope == "required",
                            help="scope.json: tenant_id, account_id, page_id, form_id")
    if target != "none":
        parent.add_argument("--target", required=target == "required",
                            help="the synthetic target (a SQLite file)")
    parent.add_argument("--now", help="the current time, ISO-8601 with a timezone")
    parent.add_argument("--log-format", choices=["text", "json"], default="text")
    return parent


def emit(doc: Any) -> None:
    """Print one result as one line of compact JSON, flushed at once."""
    from runner.jsonio import dumps_line

    sys.stdout.write(dumps_line(doc) + "\n")
    sys.stdout.flush()


def say_error(args: argparse.Namespace, message: str, reason: str) -> None:
    print(logs.error_line(message, fmt=args.log_format, reason=reason), file=sys.stderr)


def clock_from(args: argparse.Namespace) -> Clock:
    return FixedClock(parse_now(args.now)) if getattr(args, "now", None) else SystemClock()


def check_paths(args: argparse.Namespace) -> None:
    """``--db`` and ``--target`` naming one file would let the target corrupt the store."""
    target = getattr(args, "target", None)
    if not target or is_postgres(args.db):
        return
    from runner.io.fsguard import same_file

    if same_file(args.db, target):
        raise UsageError("--db and --target name the same file; use two separate files")
