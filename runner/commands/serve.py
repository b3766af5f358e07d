"""HTTP commands and options (SPEC E4): ``serve``, and ``start --listen``'s options.

``runner serve`` runs webhook intake, ``/metrics``, ``/healthz`` and ``/readyz`` without
the delivery loop: it takes no worker lock (intake never does), so intake stays up while
delivery is stopped, or runs beside a ``start`` on the same store.  ``runner start
--listen`` serves the same endpoints from the task group that holds the lock and runs the
cycles (``runner.loop``).

Secrets come from a file (``--webhook-secret-file``, ``--verify-token-file``) or the
environment (``RUNNER_WEBHOOK_SECRET``, ``RUNNER_VERIFY_TOKEN``), never from the command
line (where ``ps`` shows them), and are never logged.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.commands.common import (
    MAX_COUNT,
    MAX_SECONDS,
    common_options,
    intake_store,
    number,
    read_secret,
    require_sync_option,
)
from runner.errors import UsageError

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from runner import signals
    from runner.io.http.auth import WebhookAuth
    from runner.io.http.health import LoopState, Mode
    from runner.io.http.metrics import Metrics
    from runner.io.http.server import Address, HttpServer
    from runner.tasks.outcomes import CycleSummary
    from runner.worker import DurableWorker

SECRET_ENV = "RUNNER_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
TOKEN_ENV = "RUNNER_VERIFY_TOKEN"  # noqa: S105 - the variable's name, not a secret


def listen_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The HTTP options of ``start`` (``--listen`` optional) and ``serve`` (required)."""
    parser.add_argument(
        "--listen", metavar="HOST:PORT", required=required,
        help="serve webhook intake, /metrics, /healthz and /readyz on HOST:PORT (host "
             "127.0.0.1 unless given; port 0 picks a free port)"
             + ("" if required else "; default: no HTTP"))
    parser.add_argument(
        "--listen-public", action="store_true",
        help="allow a non-loopback --listen address (a webhook secret is then required)")
    parser.add_argument(
        "--webhook-secret-file", metavar="PATH",
        help=f"the app secret that signs webhooks (X-Hub-Signature-256); else ${SECRET_ENV}; "
             "without one, POST /webhook answers 403")
    parser.add_argument(
        "--verify-token-file", metavar="PATH",
        help=f"the subscription handshake's verify token; else ${TOKEN_ENV}; without one, "
             "the handshake answers 403")
    parser.add_argument(
        "--http-body-limit", type=number(int, 1024, 64 << 20), default=1 << 20, metavar="BYTES",
        help="the largest request body accepted (default 1048576; larger: 413)")
    parser.add_argument(
        "--http-timeout", type=number(float, 0.1, 3600), default=10.0, metavar="S",
        help="seconds a client may take to send a request's headers, and its body "
             "(default 10)")
    parser.add_argument(
        "--http-max-concurrency", type=number(int, 1, 100_000), default=256, metavar="N",
        help="connections and requests served at once; beyond it: 503 (default 256)")
    require_sync_option(parser, "the webhook answers 503 and /readyz is not ready")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    serve = sub.add_parser(
        "serve", parents=[common_options(scope="required")],
        help="serve webhook intake, /metrics, /healthz and /readyz without the delivery loop "
             "(no worker lock) until SIGINT/SIGTERM")
    listen_options(serve, required=True)
    serve.add_argument("--grace", type=number(float, 0, MAX_SECONDS), default=30.0,
                       metavar="S",
                       help="seconds to answer requests already received after the first "
                            "signal (default 30)")
    serve.set_defaults(handler=cmd_serve)


def health_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--health-intervals", type=number(int, 1, MAX_COUNT), default=3, metavar="N",
        help="/healthz fails when no cycle completed within N intervals (default 3)")


def webhook_auth(args: argparse.Namespace) -> WebhookAuth:
    from runner.io.http.auth import WebhookAuth

    secret = read_secret(args.webhook_secret_file, SECRET_ENV, "webhook secret")
    token = read_secret(args.verify_token_file, TOKEN_ENV, "verify token")
    return WebhookAuth(secret=secret,
                       verify_token=token.decode("utf-8", errors="replace") if token else None)


def listen_address(args: argparse.Namespace, auth: WebhookAuth) -> Address:
    """The address to listen on; a non-loopback one needs ``--listen-public`` and a
    secret (an open intake on a network would accept anyone's records)."""
    from runner.io.http.server import parse_address

    address = parse_address(args.listen)
    if not address.loopback:
        if not args.listen_public:
            raise UsageError(f"--listen {address} is not a loopback address; add "
                             "--listen-public to serve on a network")
        if auth.secret is None:
            raise UsageError(f"--listen {address} is public: configure a webhook secret "
                             f"(--webhook-secret-file or ${SECRET_ENV})")
    return address


class HttpService:
    """The HTTP server as a service of the runner loop (``loop.Service``): started once
    the lock is held, asked to drain when the cycles end."""

    def __init__(self, server: HttpServer, state: LoopState, metrics: Metrics) -> None:
        self.server, self.state, self.metrics = server, state, metrics

    async def run(self, shutdown: signals.Shutdown, *,
                  task_status: TaskStatus[None]) -> None:
        self.state.lock_held = True
        self.state.stop_source = lambda: shutdown.stopping
        try:
            await self.server.serve(task_status=task_status)
        finally:
            self.state.lock_held = False

    def stop(self) -> None:
        self.state.stop_asked = True
        self.server.stop()

    def reconnecting(self, active: bool) -> None:
        self.state.reconnect(active, time.monotonic())

    def on_cycle(self, summary: CycleSummary) -> None:
        self.state.cycle_done(time.monotonic(), time.time())
        self.metrics.cycle_done(summary, time.time())


@dataclass(frozen=True)
class HttpOptions:
    """Everything the HTTP edge is built from (the options, or a test's choice)."""

    auth: WebhookAuth
    address: Address
    body_limit: int = 1 << 20
    timeout: float = 10.0
    max_concurrency: int = 256
    health_intervals: int = 3
    #: --require-synchronous-replication: intake refuses events unless it is synchronous
    require_synchronous: bool = False


def http_options(args: argparse.Namespace) -> HttpOptions:
    auth = webhook_auth(args)
    return HttpOptions(auth, listen_address(args, auth), body_limit=args.http_body_limit,
                       timeout=args.http_timeout, max_concurrency=args.http_max_concurrency,
                       health_intervals=getattr(args, "health_intervals", 3),
                       require_synchronous=args.require_synchronous_replication)


def build_service(
    options: HttpOptions, worker: DurableWorker, *, mode: Mode, grace: float,
    interval: float = 5.0,
) -> HttpService:
    """The app, its metrics and the bound server."""
    from runner.io.http.app import Limits, RunnerApp
    from runner.io.http.health import LoopState
    from runner.io.http.metrics import Metrics
    from runner.io.http.server import HttpServer, ServerLimits, bind
    from runner.leads.intake import Intake

    state = LoopState(mode=mode, started_at=time.monotonic(), interval=interval,
                      intervals=options.health_intervals,
                      require_synchronous=options.require_synchronous)
    store, clock = worker.store, worker.clock

    async def probe() -> None:  # /readyz: the store answers, and how it replicates now
        await worker.store.pinned_target()
        state.replication = await worker.store.replication()

    async def figures() -> list[Any]:
        from runner.io.http.figures import read_figures

        return await read_figures(store, clock)

    metrics = Metrics(state, figures)
    intake = Intake(_CommitCounter(worker, metrics.committed,  # type: ignore[arg-type]
                                   options.require_synchronous), worker.clock, worker.scope)
    app = RunnerApp(intake, options.auth, state, metrics, probe,
                    Limits(body_bytes=options.body_limit, body_timeout=options.timeout))
    sock = bind(options.address)
    server = HttpServer(app, sock, grace=grace, limits=ServerLimits(
        header_timeout=options.timeout, max_concurrency=options.max_concurrency))
    return HttpService(server, state, metrics)


class _CommitCounter:
    """The one store call intake makes, observed: records per commit (group commits)."""

    def __init__(self, worker: DurableWorker, observe: Callable[[int], None],
                 require_synchronous: bool) -> None:
        self._worker, self._observe = worker, observe
        self._require_synchronous = require_synchronous

    async def accept_many(self, items: Any, now: Any) -> Any:
        self._observe(len(items))
        store = intake_store(self._worker.store, self._require_synchronous)
        return await store.accept_many(items, now)


async def cmd_serve(args: argparse.Namespace) -> int:
    """Intake and endpoints until a signal: the first drains (``--grace``), a second
    stops at once (exit 130/143)."""
    import signal

    import anyio

    from runner.commands.common import clock_from
    from runner.commands.leads import load_scope
    from runner.worker import DurableWorker

    scope = load_scope(args.scope)
    options = http_options(args)  # bad secrets, a public address: before the store
    hard: list[int] = []
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with DurableWorker(args.db, scope, clock=clock_from(args)) as worker:
            from runner.replication import announce

            replication = await worker.store.replication()
            _log_serving(args, "/".join((scope.tenant_id, scope.account_id, scope.page_id,
                                         scope.form_id)), replication.mode)
            announce(replication)
            service = build_service(options, worker, mode="serve", grace=args.grace)
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    async for signum in signals:
                        if service.state.stop_asked:  # a second signal: at once
                            hard.append(signum)
                            tg.cancel_scope.cancel()
                            return
                        service.stop()

                tg.start_soon(watch)
                await service.server.serve()
                tg.cancel_scope.cancel()
    code = 128 + hard[0] if hard else 0
    logging.getLogger("runner.http").info(
        "runner serve stopped%s", " at once (second signal)" if hard else "",
        extra={"action": "serve.stopped", "reason": "hard_stop" if hard else "signal"})
    return code


def _log_serving(args: argparse.Namespace, scope: str, replication: str) -> None:
    """``serve``'s start-up line, once the store is open (the port follows, in
    ``http.listening``).  The store is described, never echoed (a DSN may carry a
    password)."""
    import os

    from runner import __version__
    from runner.io.stores import describe_location
    from runner.storedata import is_postgres

    logging.getLogger("runner.http").info(
        "runner %s serving", __version__,
        extra={"action": "serve.started", "version": __version__, "pid": os.getpid(),
               "store": describe_location(args.db) if is_postgres(args.db) else args.db,
               "scope": scope,
               "replication": replication})
