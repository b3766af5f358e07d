"""The delivery commands' options (``once``, ``start``, ``poll-status``): faults to
inject, poll and batch sizes, the target's quotas, the retry backoff and the alerts, with
the checks of their values (``alert_settings``).  ``runner/commands/delivery.py`` adds them
to its parsers and runs the commands."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from runner.commands.common import MAX_COUNT, MAX_SECONDS, number
from runner.errors import UsageError
from runner.limits import (
    BATCH_SIZE_RANGE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_POLL_LIMIT,
    POLL_LIMIT_RANGE,
)

if TYPE_CHECKING:
    from runner.alerts import AlertSettings


def fault_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--fault", action="append", metavar="F", help=help_text)


def poll_option(parser: argparse.ArgumentParser) -> None:
    low, high = POLL_LIMIT_RANGE
    parser.add_argument("--poll-limit", type=number(int, low, high),
                        default=DEFAULT_POLL_LIMIT,
                        metavar="N", help=f"records per poll pass ({low}-{high}, default "
                                          f"{DEFAULT_POLL_LIMIT})")


#: ``--dispatch-pipeline``'s choices, as ``DurableWorker(dispatch_pipeline=...)`` takes
#: them
PIPELINE_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def batch_option(parser: argparse.ArgumentParser) -> None:
    low, high = BATCH_SIZE_RANGE
    parser.add_argument("--batch-size", type=number(int, low, high),
                        default=DEFAULT_BATCH_SIZE, metavar="N",
                        help=f"records per target request ({low}-{high}, default "
                             f"{DEFAULT_BATCH_SIZE}): one commit marks the batch in flight, "
                             "one request sends it, one readback proves each row, one "
                             "commit records every outcome; a target that cannot batch is "
                             "sent one record per request")
    parser.add_argument("--dispatch-pipeline", choices=tuple(PIPELINE_CHOICES),
                        default="auto",
                        help="commit each batch's in-flight mark (with the outcomes of the "
                             "batch before) while the batch before is at the target, so "
                             "two batches may be in flight at once (issue 32): faster, "
                             "and a crash may leave both uncertain; auto (the default): on "
                             "for a target that deduplicates by write_id, whose uncertain "
                             "records runner settles itself, off for any other")


def _rate(text: str) -> float:
    """An argparse ``type``: ``60/min``, ``2/s`` … as requests per second."""
    from runner.leads.pacing import parse_rate

    try:
        return parse_rate(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _duration(text: str) -> float:
    """An argparse ``type``: ``1s``, ``500ms``, ``5min`` … as seconds."""
    from runner.leads.pacing import parse_duration

    try:
        return parse_duration(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def rate_option(parser: argparse.ArgumentParser, *, writes: bool = True) -> None:
    parser.add_argument("--target-rate", type=_rate, metavar="N/min",
                        help="the target's write quota, such as 60/min or 2/s: every "
                             "batch write waits its turn, evenly spaced, so the quota is "
                             "never exceeded (default: no quota; a rate-limited answer is "
                             "honoured either way)" if writes else
                             "the target's write quota; this command makes no writes, so "
                             "it paces nothing here (give --target-read-rate to pace the "
                             "status reads)")
    parser.add_argument("--target-read-rate", type=_rate, metavar="N/min",
                        help="the target's read quota, apart from the write quota: every "
                             "read (a batch's readback, a reconcile read, a status read) "
                             "waits its turn (default: reads are not paced; a "
                             "rate-limited answer still holds them)")


def retry_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retry-base", type=_duration, default=1.0, metavar="T",
                        help="backoff of a record that was not sent (failed_safe): the "
                             "first retry after T/2 to T, doubling each attempt (default "
                             "1s; 0: at once; T such as 500ms, 1s, 5min, 1h, 2d: less "
                             "than 30 days)")
    parser.add_argument("--retry-cap", type=_duration, default=300.0, metavar="T",
                        help="the longest backoff between two attempts of a record "
                             "(default 5min; less than 30 days)")


def alert_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alert-command", metavar="CMD",
                        help="run CMD (split like a shell line, not run by a shell) with a "
                             "JSON alert on stdin when something needs a person: records "
                             "became uncertain, one waits too long, polls keep failing, a "
                             "cycle stalls, the store fails")
    parser.add_argument("--alert-uncertain-age", type=number(float, 1, 30 * MAX_SECONDS),
                        default=3600.0, metavar="S",
                        help="alert when the oldest uncertain record was accepted more "
                             "than S seconds ago (default 3600)")
    parser.add_argument("--alert-poll-failures", type=number(int, 1, MAX_COUNT), default=3,
                        metavar="N", help="alert after N poll passes in a row read nothing "
                                          "(default 3)")
    parser.add_argument("--alert-cycle-stall", type=number(float, 0.1, MAX_SECONDS),
                        default=600.0, metavar="S",
                        help="alert when no cycle completes for S seconds (default 600; "
                             "more than --interval)")
    parser.add_argument("--alert-repeat", type=number(float, 1, MAX_SECONDS),
                        default=3600.0, metavar="S",
                        help="repeat a lasting alert every S seconds, no sooner "
                             "(default 3600)")
    parser.add_argument("--alert-timeout", type=number(float, 0.1, 600), default=10.0,
                        metavar="S", help="kill the alert command after S seconds "
                                          "(default 10)")


def alert_settings(args: argparse.Namespace) -> AlertSettings | None:
    """The alert settings of a command line (None: no --alert-command), checked."""
    command = getattr(args, "alert_command", None)
    if command is None:
        return None
    import shlex

    from runner.alerts import AlertSettings
    from runner.io.stores import describe_location
    from runner.storedata import is_postgres

    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--alert-command: {exc}") from None
    if not argv:
        raise UsageError("--alert-command is empty")
    interval = getattr(args, "interval", 0.0)
    if args.alert_cycle_stall <= interval:
        raise UsageError(f"--alert-cycle-stall ({args.alert_cycle_stall:g}s) must be more "
                         f"than --interval ({interval:g}s): waiting is not a stall")
    return AlertSettings(
        argv, uncertain_age=args.alert_uncertain_age, poll_failures=args.alert_poll_failures,
        cycle_stall=args.alert_cycle_stall, repeat=args.alert_repeat,
        timeout=args.alert_timeout,
        store=describe_location(args.db) if is_postgres(args.db) else args.db)
