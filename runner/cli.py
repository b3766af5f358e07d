"""Command line: ``main(argv) -> int`` with one error boundary (SPEC K8, L13).

Every command prints its result as one line of compact JSON on stdout; errors go to
stderr as one clear line (JSON with ``--log-format json``) and map to the exit codes of
``runner.errors``.  No traceback reaches the user for an error runner knows about.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from runner import logs
from runner.errors import RunnerError, UsageError

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('runner ')}: {message}")


def _common(*, scope: str, target: str) -> _Parser:
    """Options shared by the lead commands.  ``scope``/``target``: required|optional|none."""
    parent = _Parser(add_help=False)
    parent.add_argument("--db", required=True, help="store: a SQLite file path")
    if scope != "none":
        parent.add_argument("--scope", required=scope == "required",
                            help="scope.json: tenant_id, account_id, page_id, form_id")
    if target != "none":
        parent.add_argument("--target", required=target == "required",
                            help="the synthetic target (a SQLite file)")
    parent.add_argument("--now", help="the current time, ISO-8601 with a timezone")
    parent.add_argument("--log-format", choices=["text", "json"], default="text")
    return parent


def build_parser() -> argparse.ArgumentParser:
    from runner import commands

    parser = _Parser(prog="runner", description="A crash-safe foreground worker.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    accept = sub.add_parser(
        "accept", parents=[_common(scope="required", target="optional")],
        help="durably accept one event (answers after the commit)")
    accept.add_argument("--record", required=True, help="event.json, or - for stdin")
    accept.set_defaults(handler=commands.cmd_accept)

    status = sub.add_parser(
        "status", parents=[_common(scope="optional", target="optional")],
        help="print the store's state as JSON (no lock, changes nothing)")
    status.set_defaults(handler=commands.cmd_status)
    return parser


def _log_format(argv: Sequence[str]) -> logs.LogFormat:
    for i, arg in enumerate(argv):
        if arg == "--log-format" and i + 1 < len(argv) and argv[i + 1] == "json":
            return "json"
        if arg == "--log-format=json":
            return "json"
    return "text"


def main(argv: Sequence[str] | None = None) -> int:
    import anyio

    args_list = list(sys.argv[1:] if argv is None else argv)
    fmt = _log_format(args_list)
    try:
        args = build_parser().parse_args(args_list)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except RunnerError as exc:
        print(logs.error_line(exc.message, fmt=fmt, reason=exc.reason), file=sys.stderr)
        return exc.exit_code
    logs.configure(fmt)
    handler: Handler = args.handler
    try:
        return anyio.run(handler, args)
    except RunnerError as exc:
        print(logs.error_line(exc.message, fmt=fmt, reason=exc.reason), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(logs.error_line("interrupted", fmt=fmt, reason="interrupted"), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
