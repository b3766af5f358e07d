"""Outbox retention commands (SPEC K3, E6; issue 15): ``outbox export``, ``outbox
watermark``, ``outbox prune``.  The design and its guarantees: ``runner.retention``.

::

    runner outbox export --db D --after SEQ [--limit N] [--commit-watermark]
        one NDJSON line per event after SEQ ({"seq", "kind", "subject", "at",
        "payload"}), in sequence order, with no gap; a consumer keeps the last seq it
        stored and passes it as --after next time.  --commit-watermark records the last
        printed seq as the store's export watermark once the lines are flushed.
    runner outbox watermark --db D [--set SEQ]
        print {"floor", "export_watermark", "pruned", "pruned_by_kind"}; with --set,
        record SEQ as the export watermark first (forward only).
    runner outbox prune --db D --before SEQ
        remove events with seq < SEQ that every bound allows, in one recorded transaction;
        print {"pruned", "floor", "previous_floor", "limited_by", "by_kind"}.

``export --after`` below the prune floor exits 65 (``reason: pruned``): those events are
gone, and a silently shorter stream would look like no events.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runner.commands.common import clock_from, common_options, emit, number
from runner.io.stores import open_store

MAX_SEQ = 2**62
#: events per read while exporting
PAGE = 1000


def register(sub: argparse._SubParsersAction[Any]) -> None:
    outbox = sub.add_parser(
        "outbox", help="export the outbox as NDJSON, record an export watermark, prune "
                       "what was exported")
    verbs = outbox.add_subparsers(dest="verb", required=True, parser_class=type(outbox))

    export = verbs.add_parser(
        "export", parents=[common_options()],
        help="print events after --after as NDJSON (seq, kind, subject, at, payload), in "
             "sequence order; a consumer keeps the last seq it stored as its watermark")
    export.add_argument("--after", type=number(int, 0, MAX_SEQ), required=True,
                        metavar="SEQ", help="print events with seq > SEQ (0: from the "
                                            "first; below the prune floor: exit 65)")
    export.add_argument("--limit", type=number(int, 1, 10**9), metavar="N",
                        help="at most N events (default: every event now in the store)")
    export.add_argument("--commit-watermark", action="store_true",
                        help="after the lines are written and flushed, record the last "
                             "printed seq as the store's export watermark (prune never "
                             "removes events above it); safer: store the lines, then "
                             "'outbox watermark --set SEQ'")
    export.set_defaults(handler=cmd_export)

    watermark = verbs.add_parser(
        "watermark", parents=[common_options()],
        help="print the prune floor and export watermark; --set records a watermark")
    watermark.add_argument("--set", type=number(int, 0, MAX_SEQ), metavar="SEQ",
                           dest="set_to", help="record SEQ as the export watermark: every "
                           "event up to SEQ is stored by the consumer (forward only)")
    watermark.set_defaults(handler=cmd_watermark)

    prune = verbs.add_parser(
        "prune", parents=[common_options()],
        help="remove events with seq < --before, never above the export watermark (once "
             "one is recorded), never what the raw retriever has not ingested, always "
             "keeping the newest event; one transaction, recorded")
    prune.add_argument("--before", type=number(int, 1, MAX_SEQ), required=True,
                       metavar="SEQ", help="remove events with seq < SEQ (within the "
                                           "bounds; 'limited_by' says which applied)")
    prune.set_defaults(handler=cmd_prune)


async def _require(location: str) -> None:
    from runner.commands.candidates import require_store

    await require_store(location)


async def cmd_export(args: argparse.Namespace) -> int:
    from runner.jsonio import dumps_line

    await _require(args.db)
    left = args.limit if args.limit is not None else MAX_SEQ
    after, last = args.after, None
    async with await open_store(args.db, create=False) as store:
        end = await store.outbox_last_seq()  # what "every event now" means
        while left > 0 and after < end:
            events = await store.export_outbox(after, min(PAGE, left))
            if not events:
                break
            sys.stdout.write("".join(dumps_line(e) + "\n" for e in events))
            after = last = events[-1]["seq"]
            left -= len(events)
        sys.stdout.flush()
        if args.commit_watermark and last is not None:
            await store.set_export_watermark(last, _now(args))
    return 0


async def cmd_watermark(args: argparse.Namespace) -> int:
    await _require(args.db)
    async with await open_store(args.db) as store:
        if args.set_to is not None:
            await store.set_export_watermark(args.set_to, _now(args))
        emit((await store.retention_state()).to_json())
    return 0


async def cmd_prune(args: argparse.Namespace) -> int:
    from runner.pipeline.stages.raw_ingestion import LEAD_KINDS

    await _require(args.db)
    async with await open_store(args.db) as store:
        result = await store.prune_outbox(args.before, LEAD_KINDS, _now(args))
    emit(result.to_json())
    return 0


def _now(args: argparse.Namespace) -> str:
    from runner.clock import to_text

    return to_text(clock_from(args).now())
