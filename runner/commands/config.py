"""``config show``: the effective configuration of a command line, and where each value
came from (issue 19; ``runner.config``)."""

from __future__ import annotations

import argparse
from typing import Any

from runner.commands.common import Parser, emit
from runner.errors import UsageError


def register(sub: argparse._SubParsersAction[Any]) -> None:
    config = sub.add_parser("config", help="show the effective configuration")
    config.add_argument("--config", action=_Misplaced, help=argparse.SUPPRESS)
    verbs = config.add_subparsers(dest="verb", required=True, parser_class=Parser)
    show = verbs.add_parser(
        "show", help="print the options a command line would run with, each with where it "
                     "came from: flag, file (--config), 'flag and file' (--target-option) "
                     "or default (changes nothing)")
    show.add_argument("--config", metavar="FILE",
                      help="a TOML file of options (keys are the long flags without '--')")
    show.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                      help="the command line to show (default: start)")
    show.set_defaults(handler=cmd_show)


class _Misplaced(argparse.Action):
    """``runner config --config FILE``: the file belongs to ``show``; say so, instead of
    argparse's "invalid choice" for the file's name."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        raise UsageError("config: --config goes after 'show': runner config show --config "
                         "FILE [COMMAND ...]")


async def cmd_show(args: argparse.Namespace) -> int:
    from runner import config
    from runner.cli import build_parser

    parser = build_parser()
    words = list(args.words or ["start"])
    if words[0] == "--":
        words = words[1:]
    argv = [*words, *(["--config", args.config] if args.config else [])]
    applied = config.apply(parser, argv)
    namespace = parser.parse_args(applied.argv)
    leaf, depth = config.leaf(parser, applied.argv)
    assert leaf is not None  # parse_args found the command
    values = {key: {"value": _shown(action, getattr(namespace, action.dest)),
                    "from": applied.sources.get(action.dest, "default")}
              for key, action in config.options(leaf).items()
              if not key.startswith("config")}
    # the command's own words (``start``, ``job submit``): every option is in ``values``
    emit({"command": " ".join(applied.argv[:depth]),
          "config": applied.path, "values": values})
    return 0


#: what ``config show`` prints for a masked option's value (``--target-option``'s)
MASK = "***"


def _shown(action: argparse.Action, value: Any) -> Any:
    """A value as ``config show`` prints it: a masked action's values hidden, keys kept
    (an option's value may be a secret; the token itself is never in the options)."""
    if getattr(action, "masked", False) and isinstance(value, dict):
        return dict.fromkeys(sorted(value), MASK)
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(("postgresql://", "postgres://")):
        return _without_password(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _without_password(dsn: str) -> str:
    """A DSN as given, its password (if any) shown as ``***`` (``--db``, ``--target``)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "postgresql://(not shown: the DSN does not parse)"
    if parts.password is None:
        return dsn
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}"))
