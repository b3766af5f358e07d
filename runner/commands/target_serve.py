"""``runner target-serve``: the reference HTTP target server (issue 17).

A remote target to deliver to over real HTTP, with a quota and faults on demand
(``runner.io.targets.server``; the protocol: docs/reference/http-target.md).  It stores
rows in a SQLite sheet of the synthetic target's shape, and runs until SIGINT/SIGTERM.
With ``--dedupe`` it speaks protocol version 2: it deduplicates by write_id, says so in
its identity, and answers each append with the rows it holds (issue 29).  With
``--marks`` (issue 30) it speaks version 2 and keeps batch marks: it judges the mark an
append carries with its rows, and answers the mark and read-by-key calls.
"""

from __future__ import annotations

import argparse
from typing import Any

from runner import logs
from runner.commands.common import MAX_SECONDS, number, read_target_token
from runner.errors import UsageError


def register(sub: argparse._SubParsersAction[Any]) -> None:
    serve = sub.add_parser(
        "target-serve",
        help="run the reference HTTP target server (the protocol of --target http://…), "
             "with a quota and faults on demand, until SIGINT/SIGTERM")
    serve.add_argument("--listen", required=True, metavar="HOST:PORT",
                       help="where to listen (host 127.0.0.1 unless given; port 0 picks a "
                            "free port, printed as 'listening on port N' on stderr)")
    serve.add_argument("--store", required=True, metavar="PATH",
                       help="the sheet: a SQLite file of the synthetic target's shape "
                            "(created if absent)")
    serve.add_argument("--token-file", metavar="PATH",
                       help="the bearer token every request must carry; else "
                            "$RUNNER_TARGET_TOKEN; with neither, no token is asked "
                            "(loopback only)")
    serve.add_argument("--quota", metavar="N/min",
                       help="append requests allowed per minute (N/min) or second (N/s); "
                            "beyond it: 429 with Retry-After, nothing applied")
    serve.add_argument("--dedupe", action="store_true",
                       help="speak protocol version 2: never make a second row for a "
                            "write_id the sheet holds (within one append too), declare "
                            "it in the identity, and answer each append with the rows "
                            "held for its write_ids (without it: version 1, no dedupe, "
                            "like a spreadsheet)")
    serve.add_argument("--marks", action="store_true",
                       help="speak protocol version 2 and keep batch marks (issue 30): "
                            "declare marks_batches in the identity, refuse (409, nothing "
                            "applied) an append whose mark is stale or another store's, "
                            "and answer GET/POST mark and POST read_keys; independent of "
                            "--dedupe")
    serve.add_argument("--fault", action="append", metavar="KIND[:S][@P]",
                       help="inject a fault with probability P (default 1): latency:S, "
                            "error-before, unavailable, throttle, reject, drop-after-apply, "
                            "slow-after-apply:S, refuse, read-error, and with --dedupe "
                            "rows-incomplete, rows-malformed (repeatable)")
    serve.add_argument("--fault-seed", type=number(int, 0, 2**63), metavar="N",
                       help="seed the fault draws (repeatable runs)")
    serve.add_argument("--grace", type=number(float, 0, MAX_SECONDS), default=5.0,
                       metavar="S", help="seconds to answer requests in flight after the "
                                         "first signal (default 5)")
    serve.add_argument("--log-format", choices=["text", "json"], default="text")
    serve.add_argument("--log-level", choices=logs.LEVELS, default="info")
    serve.set_defaults(handler=cmd_target_serve)


async def cmd_target_serve(args: argparse.Namespace) -> int:
    import logging
    import random
    import signal

    import anyio

    from runner.io.http.server import HttpServer, ServerLimits, bind, parse_address
    from runner.io.targets.marksheet import MarkedSheet
    from runner.io.targets.server import (
        ROWS_FAULTS,
        DropProtocol,
        FaultPlan,
        TargetServerApp,
        open_sheet,
        parse_fault,
        parse_quota,
    )

    log = logging.getLogger("runner.target_server")
    address = parse_address(args.listen)
    token = read_target_token(args.token_file)
    if token is None and not address.loopback:
        raise UsageError(f"--listen {address} is not a loopback address: a token is required "
                         "(--token-file or $RUNNER_TARGET_TOKEN)")
    quota = parse_quota(args.quota) if args.quota else None
    faults = [parse_fault(text) for text in args.fault or ()]
    rows_faults = sorted({f.kind for f in faults if f.kind in ROWS_FAULTS})
    if rows_faults and not args.dedupe:
        raise UsageError(f"--fault {rows_faults[0]}: only a --dedupe server answers an "
                         "append with rows")
    plan = FaultPlan(faults, random.Random(args.fault_seed))
    sheet = open_sheet(args.store)
    marks = MarkedSheet(sheet.path) if args.marks else None
    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            if plan.has("refuse"):
                return await _refuse(address, signals, log)
            app = TargetServerApp(sheet, token=token, quota=quota, faults=plan,
                                  dedupe=args.dedupe, marks=marks)
            server = HttpServer(app, bind(address), grace=args.grace,
                                limits=ServerLimits(max_concurrency=1024),
                                protocol=DropProtocol)
            hard: list[int] = []
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    stopping = False
                    async for signum in signals:
                        if stopping:
                            hard.append(signum)
                            tg.cancel_scope.cancel()
                            return
                        stopping = True
                        server.stop()

                tg.start_soon(watch)
                await server.serve()
                tg.cancel_scope.cancel()
            c = app.counters
            log.info("stopped: %d appends, %d rows, %d throttled, %d dropped, %d reads",
                     c.appends, c.rows, c.throttled, c.dropped, c.reads,
                     extra={"action": "target_server.stopped", "rows": c.rows})
            return 128 + hard[0] if hard else 0
    finally:
        if marks is not None:
            marks.close()
        sheet.close()


async def _refuse(address: Any, signals: Any, log: Any) -> int:
    """``--fault refuse``: hold the port without listening, so every connection is
    refused (ECONNREFUSED), until a signal."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in address.host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError as exc:
            raise UsageError(f"--listen {address}: {exc.strerror or exc}") from None
        port = sock.getsockname()[1]
        log.info("refusing connections on port %s", port,
                 extra={"action": "target_server.refusing", "count": port})
        async for _ in signals:
            return 0
        return 0
    finally:
        sock.close()
