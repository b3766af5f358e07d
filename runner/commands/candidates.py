"""Candidate commands (SPEC C6): ``candidate add|analyze|promote|list`` and ``sweep``.

They take no ``--scope``: candidates are not lead records, so they work on a store with a
pinned scope and on one without.  Each prints one line of compact JSON; a refused
operation raises ``RuleViolation`` (exit 65, one line on stderr) and changes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timedelta
from typing import Any

from runner.candidates import rules
from runner.candidates.results import DEFAULT_QUORUM
from runner.clock import parse_now
from runner.commands.common import clock_from, common_options, emit, number
from runner.errors import StoreNotFound
from runner.io.stores import describe_location, open_store, store_exists
from runner.jsonio import dumps_line

#: 10 years: a bound that keeps every computed time far from datetime's limits
MAX_TTL_MINUTES = 10 * 366 * 24 * 60
FAULTS = ("crash-before-decision", "crash-after-decision")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    candidate = sub.add_parser(
        "candidate", help="candidate lifecycle: add, analyze, promote, list")
    verbs = candidate.add_subparsers(
        dest="candidate_command", required=True, parser_class=type(candidate),
        metavar="{add,analyze,promote,list}")

    add = verbs.add_parser("add", parents=[common_options()],
                           help="create a discovered candidate (T1, T2)")
    add.add_argument("--id", required=True, help="the candidate's id (unique)")
    add.add_argument("--quorum", type=number(int, 1, 1000), default=DEFAULT_QUORUM,
                     help=f"distinct analyses needed to promote (default {DEFAULT_QUORUM})")
    add.add_argument("--ttl-minutes", type=number(int, 1, MAX_TTL_MINUTES), default=30,
                     help="expires_at = created_at + this (default 30)")
    add.add_argument("--analysis-deadline",
                     help="ISO-8601 with a timezone, on or before expires_at "
                          "(default: expires_at)")
    add.set_defaults(handler=cmd_add)

    analyze = verbs.add_parser("analyze", parents=[common_options()],
                               help="record one analysis by a distinct analyst")
    analyze.add_argument("--id", required=True)
    analyze.add_argument("--analyst", required=True)
    analyze.set_defaults(handler=cmd_analyze)

    promote = verbs.add_parser(
        "promote", parents=[common_options()],
        help="promoting (committed), then the decision (committed), then promoted")
    promote.add_argument("--id", required=True)
    promote.add_argument("--decision-id", required=True)
    promote.add_argument("--fault", choices=FAULTS,
                         help="exit 73 right after promoting (or the decision) commits")
    promote.set_defaults(handler=cmd_promote)

    listing = verbs.add_parser("list", parents=[common_options()],
                               help="every candidate, in creation order, as one JSON list")
    listing.set_defaults(handler=cmd_list)

    sweep = sub.add_parser("sweep", parents=[common_options()],
                           help="run sweepCandidates once: expire (T3, T4), reconcile "
                                "stuck promotions")
    sweep.set_defaults(handler=cmd_sweep)


def parse_time(value: str, option: str) -> datetime:
    return parse_now(value, option)


async def require_store(location: str) -> None:
    """Commands other than ``add`` never create a store as a side effect."""
    if not await store_exists(location):
        raise StoreNotFound(f"no store at {describe_location(location)}")


def crash(fault: str, after: str) -> None:
    """A simulated crash: no cleanup, no answer, exit 73 (like a killed process)."""
    sys.stdout.flush()
    print(f"runner: simulated crash (--fault {fault}) after {after} committed",
          file=sys.stderr, flush=True)
    os._exit(73)


async def cmd_add(args: argparse.Namespace) -> int:
    now = clock_from(args).now()
    deadline = (parse_time(args.analysis_deadline, "--analysis-deadline")
                if args.analysis_deadline else None)
    # the rules refuse before the store is touched (not even created)
    candidate = rules.new_candidate(
        args.id, now, quorum=args.quorum, ttl=timedelta(minutes=args.ttl_minutes),
        analysis_deadline=deadline)
    async with await open_store(args.db) as store:
        added = await store.add_candidate(candidate)
    emit(added.to_json())
    return 0


async def cmd_analyze(args: argparse.Namespace) -> int:
    now = clock_from(args).now()
    rules.check_name(args.id, "--id")
    rules.check_name(args.analyst, "--analyst")
    await require_store(args.db)
    async with await open_store(args.db) as store:
        analyzed = await store.analyze_candidate(args.id, args.analyst, now)
    emit(analyzed.to_json())
    return 0


async def cmd_promote(args: argparse.Namespace) -> int:
    clock = clock_from(args)
    rules.check_name(args.id, "--id")
    rules.check_name(args.decision_id, "--decision-id")
    await require_store(args.db)
    async with await open_store(args.db) as store:
        await store.begin_promotion(args.id, clock.now())
        if args.fault == "crash-before-decision":
            crash(args.fault, "promoting")
        await store.record_decision(args.id, args.decision_id, clock.now())
        if args.fault == "crash-after-decision":
            crash(args.fault, "the decision")
        promoted = await store.finish_promotion(args.id, clock.now())
    emit(promoted.to_json())
    return 0


async def cmd_list(args: argparse.Namespace) -> int:
    """One JSON line, streamed: a store with 100,000 candidates is never held whole."""
    async with await open_store(args.db, create=False) as store, store.reading():
        out = sys.stdout
        out.write("[")
        first = True
        async for candidate in store.iter_candidates():
            out.write(("" if first else ",") + dumps_line(candidate.to_json()))
            first = False
        out.write("]\n")
    out.flush()
    return 0


async def cmd_sweep(args: argparse.Namespace) -> int:
    now = clock_from(args).now()
    await require_store(args.db)
    async with await open_store(args.db) as store:
        result = await store.sweep_candidates(now)
    emit(result)
    return 0
