"""Command line: ``main(argv) -> int`` with one error boundary (SPEC K8, L13).

Every command prints its result as one line of compact JSON on stdout; errors go to
stderr as one clear line (JSON with ``--log-format json``) and map to the exit codes of
``runner.errors``.  No traceback reaches the user for an error runner knows about.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from runner import __version__, logs
from runner.errors import RunnerError, leaves

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


#: command modules, each with ``register(subparsers)``, in the order ``--help`` lists them
COMMAND_MODULES = (
    "runner.commands.leads",
    "runner.commands.delivery",
    "runner.commands.candidates",
    "runner.commands.pipeline",
    "runner.commands.outbox",
    "runner.commands.serve",
    "runner.commands.target_serve",
    "runner.commands.operators",
    "runner.commands.config",
)

#: which module registers each command: a command line naming one imports only that
#: module (start-up of ``status`` does not pay for the others); a test checks the table
COMMANDS = {
    "accept": "runner.commands.leads",
    "status": "runner.commands.leads",
    "once": "runner.commands.delivery",
    "start": "runner.commands.delivery",
    "observe": "runner.commands.delivery",
    "poll-status": "runner.commands.delivery",
    "candidate": "runner.commands.candidates",
    "sweep": "runner.commands.candidates",
    "worker": "runner.commands.pipeline",
    "job": "runner.commands.pipeline",
    "backlog": "runner.commands.pipeline",
    "pipeline": "runner.commands.pipeline",
    "outbox": "runner.commands.outbox",
    "serve": "runner.commands.serve",
    "target-serve": "runner.commands.target_serve",
    "uncertain": "runner.commands.operators",
    "resolve": "runner.commands.operators",
    "target": "runner.commands.operators",
    "config": "runner.commands.config",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, only with the subcommands its command needs.

    The command is the first argument (``runner`` has only ``--version`` before it).  A known
    command gets its own module's subcommands only, which parse it exactly as the full
    parser would; anything else (``--help``, no command, an unknown one) gets them all,
    so that usage and error messages list every command."""
    import importlib

    from runner.commands.common import Parser

    modules: tuple[str, ...] = COMMAND_MODULES
    if argv and argv[0] in COMMANDS:
        modules = (COMMANDS[argv[0]],)
    parser = Parser(prog="runner", description="A crash-safe foreground worker.")
    parser.add_argument("--version", action="version", version=f"runner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def _log_format(argv: Sequence[str]) -> logs.LogFormat:
    for i, arg in enumerate(argv):
        if arg == "--log-format" and i + 1 < len(argv) and argv[i + 1] == "json":
            return "json"
        if arg == "--log-format=json":
            return "json"
    return "text"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    fmt = _log_format(args_list)
    try:
        if os.environ.get("RUNNER_CRASH_AT"):  # crashpoints.POINT_ENV; unset, no import
            from runner import crashpoints

            crashpoints.check_environment()
        if args_list[:1] != ["config"] and any(
                a == "--config" or a.startswith("--config=") for a in args_list):
            from runner import config  # a file's values join the command line

            args_list = config.apply(build_parser(), args_list).argv
            fmt = _log_format(args_list)
        args = build_parser(args_list).parse_args(args_list)
        logs.configure(fmt, getattr(args, "log_level", "info"),
                       log_file=getattr(args, "log_file", None))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except RunnerError as exc:
        logs.report_error(exc.message, fmt=fmt, reason=exc.reason)
        return exc.exit_code
    try:
        return _run(args, fmt)
    finally:
        logs.close()


#: seconds a Python thread may hold the interpreter while another waits for it (CPython's
#: default is 5 ms).  A dispatch run's thread waits for it after each SQLite statement and
#: target call, and the loop's thread is parsing the next page meanwhile: with 5 ms, a
#: statement that took 5 ms could wait as long again.  Interleaved ``once`` runs of 20,000
#: records at batch 250 dispatched 4-9% more records a second at 0.2 ms than at 5 ms (the
#: batches whose statement took twice its median: 22 of 80, then 11-15); a thread that
#: runs alone never waits.
SWITCH_INTERVAL = 0.0002


def _run(args: argparse.Namespace, fmt: logs.LogFormat) -> int:
    import anyio

    sys.setswitchinterval(SWITCH_INTERVAL)
    handler: Handler = args.handler
    try:
        code = anyio.run(handler, args)
    except RunnerError as exc:
        _answer_refusal(exc)
        logs.report_error(exc.message, fmt=fmt, reason=exc.reason)
        return exc.exit_code
    except KeyboardInterrupt:
        logs.report_error("interrupted", fmt=fmt, reason="interrupted")
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (``runner status | head``): stop quietly, as a
        # pipeline expects; what was committed stays committed
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except BaseExceptionGroup as group:
        # a task group (the runner loop) wraps what its tasks raised: a store error or a
        # lost lock inside a cycle is still one line and its exit code, not a traceback
        error = _sole_runner_error(group)
        if error is None:
            if os.environ.get("RUNNER_DEBUG") or not isinstance(group, Exception):
                raise
            return _internal_error(group, fmt)
        _answer_refusal(error)
        logs.report_error(error.message, fmt=fmt, reason=error.reason)
        return error.exit_code
    except Exception as exc:  # the one boundary: a bug is one line here, not a traceback
        if os.environ.get("RUNNER_DEBUG"):
            raise
        return _internal_error(exc, fmt)
    return code


def _answer_refusal(exc: RunnerError) -> None:
    """A refused command (exit 65) answers on stdout too, as every command answers: one
    JSON line ``{"result": "refused", "reason", …}`` (``runner.errors.refusal``)."""
    from runner.errors import BadInputError, refusal

    if isinstance(exc, BadInputError):
        from runner.jsonio import dumps_line

        sys.stdout.write(dumps_line(refusal(exc)) + "\n")
        sys.stdout.flush()


def _internal_error(exc: Exception, fmt: logs.LogFormat) -> int:
    message = f"internal error ({type(exc).__name__}: {exc}); set RUNNER_DEBUG=1 for details"
    logs.report_error(message, fmt=fmt, reason="internal")
    return 70


def _sole_runner_error(group: BaseExceptionGroup[BaseException]) -> RunnerError | None:
    """The first RunnerError of a group whose every leaf is one (else None: a bug)."""
    found = leaves(group)
    first = found[0] if found else None
    if isinstance(first, RunnerError) and all(isinstance(x, RunnerError) for x in found):
        return first
    return None


def entry() -> None:
    """The process entry point (``runner`` script, ``python run.py``).

    The process ends with ``os._exit`` once its output is flushed and the exit handlers
    have run (``atexit``: logging's among them): what ``main`` opened it has closed (the
    stores and targets by their context managers, the log file in ``main``), and the rest
    of an interpreter's finalization only tears down modules and objects that the exit
    frees anyway.  That teardown took 20-30% of an idle ``once``'s whole-process time
    (``bench/startup.py``: 96 ms of 495 at a load of 4 on 2 cores)."""
    code = main()
    if threading.active_count() == 1:
        atexit._run_exitfuncs()
    # else a cancelled target call may still be blocked in its worker thread (a hard
    # stop, or a read interrupted by a stop): exit now instead of waiting for it.  Its
    # record is already uncertain or still in flight; nothing else is left to clean up.
    with contextlib.suppress(OSError):  # a reader that went away: the answer is lost
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
