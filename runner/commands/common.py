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
    from runner.replication import IntakeWrites
    from runner.store import IntakeStore
    from runner.tasks.reconnect import ReconnectPolicy


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
        # a command's parser names its command (``once: …``); the top one adds nothing
        # to the error line's own ``runner: error:``
        if self.prog == "runner":
            raise UsageError(message)
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


def reconnect_option(parser: argparse.ArgumentParser, *, what: str = "the run") -> None:
    """``--reconnect-max S``: how long a long-running command waits for a lost store."""
    from runner.limits import DEFAULT_RECONNECT_MAX

    parser.add_argument(
        "--reconnect-max", type=number(float, 0, MAX_SECONDS),
        default=DEFAULT_RECONNECT_MAX, metavar="S",
        help=f"when the store's server goes away (a PostgreSQL restart or failover), "
             f"reconnect for at most S seconds (default {DEFAULT_RECONNECT_MAX:g}; 0: "
             f"end {what} at once, exit 74), trying again after 0.1 s doubling up to 2 s, "
             "with jitter")


def reconnect_policy(args: argparse.Namespace) -> ReconnectPolicy:
    from runner.tasks.reconnect import ReconnectPolicy

    return ReconnectPolicy(limit=args.reconnect_max)


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


def target_option(text: str) -> tuple[str, str]:
    """An argparse ``type`` for ``--target-option``: ``KEY=VALUE`` as ``(key, value)``, the
    key checked (``runner.leads.settings.OPTION_KEY``), the value any string.  An error
    never shows the value (it may be a secret)."""
    from runner.leads.settings import check_option_key

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("takes KEY=VALUE (no '=' was given)")
    try:
        return check_option_key(key), value
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class OptionAction(argparse.Action):
    """``--target-option KEY=VALUE``, repeated: a dict of key to value on the namespace;
    a key given twice is a usage error.  ``keyed``: a config file's options join the
    command line's key by key (``runner.config``); ``masked``: ``config show`` hides the
    values."""

    keyed = True
    masked = True

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        key, value = values
        options = dict(getattr(namespace, self.dest, None) or {})
        if key in options:
            parser.error(f"{option_string or self.dest} {key}: given twice (each key once)")
        options[key] = value
        setattr(namespace, self.dest, options)


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
                                 "database), or the synthetic target's SQLite file (a name "
                                 "ending in .db, .sqlite or .sqlite3, or sqlite:PATH); with "
                                 "--target-adapter, whatever that adapter takes")
        parent.add_argument("--target-adapter", metavar="MODULE:FACTORY",
                            help="import MODULE and call FACTORY(target), or FACTORY(target, "
                                 "settings=...) when it has a settings parameter, for the "
                                 "adapter (your own code, trusted: importing it runs it)")
        parent.add_argument("--target-table", metavar="NAME",
                            help="with a postgresql:// --target: the table to deliver into "
                                 "(NAME or SCHEMA.NAME; created on first use), the "
                                 "PostgreSQL table target")
        parent.add_argument("--target-token-file", metavar="PATH",
                            help="the HTTP target's bearer token, or a --target-adapter's "
                                 "settings.token; else $RUNNER_TARGET_TOKEN (never logged)")
        parent.add_argument("--target-timeout", type=number(float, 0.1, 3600), metavar="S",
                            help="seconds the HTTP target may take to answer a request "
                                 "(read timeout; default 10), the PostgreSQL table target "
                                 "a statement (default 10), or a --target-adapter's "
                                 "settings.timeout (default: none, the adapter's own)")
        parent.add_argument("--target-option", action=OptionAction, metavar="KEY=VALUE",
                            type=target_option,
                            help="an option for a --target-adapter factory "
                                 "(settings.options; repeatable, each KEY once; values are "
                                 "masked by config show, yet keep secrets in files)")
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


REQUIRE_SYNC_FLAG = "--require-synchronous-replication"


def require_sync_option(parser: argparse.ArgumentParser, refusal: str) -> None:
    parser.add_argument(REQUIRE_SYNC_FLAG, action="store_true",
                        help="take no event unless the store runs under synchronous "
                             "replication (status: replication.mode synchronous, with "
                             f"enough standbys connected); otherwise {refusal}, and "
                             "nothing is stored")


def intake_store(store: IntakeWrites, require_synchronous: bool) -> IntakeStore:
    """The store intake commits to: with ``--require-synchronous-replication``, one that
    refuses every commit unless replication is synchronous (``runner.replication``)."""
    if not require_synchronous:
        return store
    from runner.replication import SynchronousIntake

    return SynchronousIntake(store)


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
    a companion flag the target would not take is refused (:func:`check_target`);
    ``--target-table`` goes with a postgresql:// ``--target`` only, and it with one."""
    check_target_text(args)
    check_target(args)
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
    store = os.path.realpath(args.db)
    for suffix in ("-wal", "-shm", "-journal"):
        if os.path.realpath(target) == store + suffix:
            raise UsageError(f"--target {target!r} is the store's own {suffix[1:]} file; "
                             "give the target a file of its own")


def check_target_text(args: argparse.Namespace) -> None:
    """A built-in ``--target`` that is no URL, DSN or SQLite file name is a typo, refused
    (``compose.check_target_text``); ``sqlite:PATH`` becomes ``PATH``."""
    target = getattr(args, "target", None)
    if target is None or getattr(args, "target_adapter", None) is not None:
        return
    from runner.io.targets.compose import check_target_text as checked

    args.target = checked(target)


def target_given(args: argparse.Namespace) -> tuple[str, ...]:
    """The companion flags of ``--target`` a command line gave, as the refusals name
    them: ``--target-token-file``, ``--target-timeout``, ``--target-option KEY``."""
    given = [flag for flag, dest in (("--target-token-file", "target_token_file"),
                                     ("--target-timeout", "target_timeout"))
             if getattr(args, dest, None) is not None]
    given.extend(f"--target-option {key}" for key in getattr(args, "target_option", None) or {})
    return tuple(given)


def check_target(args: argparse.Namespace) -> None:
    """Refuse, before anything is opened, a companion flag that the command line's built-in
    target would not take (a ``--target-adapter`` factory's answer is read when it is
    loaded).  Light: ``status`` can afford it."""
    given = target_given(args)
    if not given or not hasattr(args, "target"):
        return
    from runner.io.targets.compose import check_given

    check_given(args.target, getattr(args, "target_adapter", None), given)


def open_target(args: argparse.Namespace) -> CRMAdapter | None:
    """The adapter of a command line's ``--target`` and its companions (None: none).
    Close it with ``runner.io.targets.close_adapter``."""
    from runner.io.targets.compose import TargetOptions, is_url, open_adapter
    from runner.leads.settings import TargetSettings

    target: str | None = getattr(args, "target", None)
    adapter: str | None = getattr(args, "target_adapter", None)
    token_file = getattr(args, "target_token_file", None)
    token = None
    if adapter is not None:  # the adapter's bytes, whatever they are
        token = read_secret(token_file, TARGET_TOKEN_ENV, "target token")
    elif target is not None and is_url(target):  # an HTTP header's
        token = read_target_token(token_file)
    settings = TargetSettings(token=token, timeout=getattr(args, "target_timeout", None),
                              options=getattr(args, "target_option", None) or {})
    return open_adapter(TargetOptions(target, adapter=adapter, settings=settings,
                                      given=target_given(args),
                                      table=getattr(args, "target_table", None)))
