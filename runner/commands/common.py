"""Helpers shared by the command modules: output, options, clock, paths."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from runner import logs
from runner.clock import Clock, FixedClock, SystemClock, parse_now
from runner.errors import UsageError
from runner.storedata import is_postgres

if TYPE_CHECKING:
    from runner.leads.port import CRMAdapter


def terminal_columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size().columns`` gives it: ``$COLUMNS``
    when positive, else the width of stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    if sys.__stdout__ is None:
        return 80
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, given the terminal width.  argparse builds one formatter per
    ``add_argument`` and, without a width, imports ``shutil`` to read it: that loads zlib,
    bz2 and lzma, 3-7 ms of every command's start-up (``python -X importtime``), for a
    width only ``--help`` uses."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_columns() - 2 if width is None else width)


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('runner ')}: {message}")


#: the largest secret or token file read (webhook secret, verify token, target token)
MAX_SECRET_BYTES = 4096
#: the environment variable the HTTP target's bearer token is read from
TARGET_TOKEN_ENV = "RUNNER_TARGET_TOKEN"  # noqa: S105 - the variable's name, not a secret


def read_secret(path: str | None, env: str, what: str, *,
                printable: bool = False) -> bytes | None:
    """A secret from the file ``path``, else from ``$env``, else None; surrounding
    whitespace stripped.  Never echoed in an error.  ``printable``: it must be printable
    ASCII without spaces (it goes into an HTTP header)."""
    if path is not None:
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"cannot read the {what} file {path!r}: "
                             f"{exc.strerror or exc}") from None
        if len(data) > MAX_SECRET_BYTES:
            raise UsageError(f"the {what} file {path!r} is larger than {MAX_SECRET_BYTES} "
                             "bytes")
    else:
        text = os.environ.get(env)
        if text is None:
            return None
        data = text.encode("utf-8", errors="surrogateescape")
    value = data.strip()
    if not value:
        raise UsageError(f"the {what} is empty")
    if printable and any(b < 0x21 or b > 0x7e for b in value):
        raise UsageError(f"the {what} must be printable ASCII without spaces")
    return value


def read_target_token(path: str | None) -> bytes | None:
    """The HTTP target's bearer token: ``--target-token-file``/``--token-file``, else
    ``$RUNNER_TARGET_TOKEN``, else None."""
    return read_secret(path, TARGET_TOKEN_ENV, "target token", printable=True)


#: the largest number of seconds any duration option takes (one day)
MAX_SECONDS = 86_400.0
#: the largest count (cycles, records per cycle) an option takes
MAX_COUNT = 10**9


def number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    """An argparse ``type``: a finite ``kind`` between ``low`` and ``high`` inclusive
    (``inf``, ``nan`` and ``1e308`` seconds are usage errors, never a crash later)."""
    def parse(value: str) -> int | float:
        try:
            parsed = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if not math.isfinite(parsed) or not low <= parsed <= high:
            raise argparse.ArgumentTypeError(f"{value!r} must be between {low:g} and {high:g}")
        return parsed
    return parse


def module_name(value: str) -> str:
    """An argparse ``type`` for ``--plugin``: an absolute dotted module name, checked
    before anything is imported."""
    parts = value.split(".")
    if not all(part.isidentifier() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a module name (dotted identifiers, such as my_pkg.plugin)")
    return value


def plugin_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        type=module_name,
                        help=f"{help_text} (repeatable; trusted code: it runs as runner)")


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
                            help="the target: an http(s):// URL (the HTTP target protocol), "
                                 "a postgresql:// DSN with --target-table (a table of your "
                                 "database), else the synthetic target's SQLite file; with "
                                 "--target-adapter, whatever that adapter takes")
        parent.add_argument("--target-adapter", metavar="MODULE:FACTORY",
                            help="import MODULE and call FACTORY(target) for the adapter "
                                 "(your own code, trusted: importing it runs it)")
        parent.add_argument("--target-table", metavar="NAME",
                            help="with a postgresql:// --target: the table to deliver into "
                                 "(NAME or SCHEMA.NAME; created on first use), the "
                                 "PostgreSQL table target")
        parent.add_argument("--target-token-file", metavar="PATH",
                            help="the HTTP target's bearer token; else "
                                 "$RUNNER_TARGET_TOKEN (never logged)")
        parent.add_argument("--target-timeout", type=number(float, 0.1, 3600), default=10.0,
                            metavar="S",
                            help="seconds the HTTP target may take to answer a request "
                                 "(read timeout), or the PostgreSQL table target a "
                                 "statement (default 10)")
    parent.add_argument("--now", help="the current time, ISO-8601 with a timezone")
    parent.add_argument("--config", metavar="FILE",
                        help="read options from a TOML file (keys are the long flags "
                             "without '--'; a flag on the command line wins)")
    parent.add_argument("--log-format", choices=["text", "json"], default="text")
    parent.add_argument("--log-file", metavar="PATH",
                        help="append log lines to PATH (0600) instead of stderr; reopened "
                             "on SIGHUP (for logrotate)")
    parent.add_argument("--log-level", choices=logs.LEVELS, default="info",
                        help="the least important lines logged (default info; debug also "
                             "shows idle cycles)")
    return parent


def emit(doc: Any) -> None:
    """Print one result as one line of compact JSON, flushed at once."""
    from runner.jsonio import dumps_line

    sys.stdout.write(dumps_line(doc) + "\n")
    sys.stdout.flush()


def say_error(args: argparse.Namespace, message: str, reason: str) -> None:
    logs.report_error(message, fmt=args.log_format, reason=reason)


def clock_from(args: argparse.Namespace) -> Clock:
    return FixedClock(parse_now(args.now)) if getattr(args, "now", None) else SystemClock()


def check_paths(args: argparse.Namespace) -> None:
    """``--db`` and ``--target`` naming one file would let the target corrupt the store;
    ``--target-table`` goes with a postgresql:// ``--target`` only, and it with one."""
    target = getattr(args, "target", None)
    table = getattr(args, "target_table", None)
    if table is not None or (target or "").startswith(("postgresql://", "postgres://")):
        from runner.io.targets.pgtable.names import check_table_option

        check_table_option(target, table, getattr(args, "target_adapter", None))
    if (not target or is_postgres(args.db) or getattr(args, "target_adapter", None)
            or target.startswith(("http://", "https://", "postgresql://", "postgres://"))):
        return
    from runner.io.fsguard import same_file

    if same_file(args.db, target):
        raise UsageError("--db and --target name the same file; use two separate files")


def open_target(args: argparse.Namespace) -> CRMAdapter | None:
    """The adapter of a command line's ``--target`` and its companions (None: none).
    Close it with ``runner.io.targets.close_adapter``."""
    from runner.io.targets.compose import TargetOptions, open_adapter

    target: str | None = getattr(args, "target", None)
    url = target is not None and target.startswith(("http://", "https://"))
    token_file = getattr(args, "target_token_file", None)
    if token_file is not None and not url:
        raise UsageError("--target-token-file is for an http(s):// --target")
    token = read_target_token(token_file) if url else None
    return open_adapter(TargetOptions(
        target, adapter=getattr(args, "target_adapter", None), token=token,
        read_timeout=getattr(args, "target_timeout", 10.0),
        table=getattr(args, "target_table", None)))
