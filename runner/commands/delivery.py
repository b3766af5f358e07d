"""Delivery commands: ``once`` (SPEC L8, L13)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from runner.commands.common import check_paths, clock_from, common_options, emit
from runner.commands.leads import load_scope
from runner.io.faults import FaultyAdapter, parse_faults
from runner.io.synthetic_target import SyntheticTarget
from runner.port import CRMAdapter, CRMRecordPort
from runner.worker import DurableWorker


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def delivery_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--fault", action="append", metavar="F",
                        help="inject a fault into every target call of the run: outage, "
                             "timeout, crash-after-write, crash-before-write, read-error")
    parent.add_argument("--dispatch-limit", type=_positive, metavar="N",
                        help="send at most N records per cycle (default: all)")
    return parent


def register(sub: argparse._SubParsersAction[Any]) -> None:
    once = sub.add_parser(
        "once", parents=[common_options(scope="required", target="required"),
                         delivery_options()],
        help="run one cycle: recover, reconcile, dispatch; print its summary")
    once.set_defaults(handler=cmd_once)


@asynccontextmanager
async def open_worker(args: argparse.Namespace) -> AsyncIterator[DurableWorker]:
    """The store, the synthetic target (with any faults) and the worker, from options."""
    check_paths(args)
    scope = load_scope(args.scope)
    faults = parse_faults(args.fault)
    target = SyntheticTarget(args.target)
    adapter: CRMAdapter = FaultyAdapter(target, faults) if faults else target
    try:
        async with DurableWorker(args.db, scope, CRMRecordPort(adapter),
                                 clock=clock_from(args)) as worker:
            yield worker
    finally:
        target.close()


async def cmd_once(args: argparse.Namespace) -> int:
    async with open_worker(args) as worker:
        summary = await worker.run_cycle(dispatch_limit=args.dispatch_limit)
    emit(summary.to_json())
    return 0
