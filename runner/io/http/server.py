"""The HTTP server: uvicorn, run as one task of the runner's anyio task group.

Why uvicorn (and not hypercorn): both are well kept ASGI servers that run on the asyncio
loop runner's anyio backend already uses.  uvicorn parses HTTP/1.1 with ``httptools`` (the
C parser of Node.js), which is several times faster per request than the pure-Python
``h11`` hypercorn parses with, and webhook intake is one small request per record; it
bounds concurrency itself (``limit_concurrency``: 503 beyond it) and drains on shutdown
(``timeout_graceful_shutdown``).  HTTP/2 and HTTP/3, hypercorn's strengths, buy nothing
for a webhook endpoint behind a proxy or on loopback.

How it is embedded:

* runner opens the listening socket itself (:func:`bind`), before the store is touched:
  a busy port or a refused address is one clear error (exit 2), and a test can ask for
  port 0 and read the port it got;
* uvicorn's own signal handling is switched off (:class:`_Server`): signals belong to
  the runner loop, which asks the server to stop (:meth:`HttpServer.stop`) when the
  cycles end;
* stopping drains: the listener closes, idle keep-alive connections close, and requests
  already received are answered within ``grace`` seconds (then they are cancelled: a
  cancelled intake request gets no answer, never a 200 for something not committed).
  Cancelling the task (a second signal) stops at once.

Hardening the app cannot do itself is here: a header read timeout (a client that opens a
connection and trickles header bytes is disconnected after ``header_timeout`` seconds,
which uvicorn alone does not do), the header size bound of the parser, and the
concurrency bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskStatus
from uvicorn import Config, Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from runner.errors import UsageError

log = logging.getLogger("runner.http")

#: an ASGI 3 application (runner's intake app, the reference target server)
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (host ``127.0.0.1``)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT with a port 0-65535")
    return Address(host, int(port))


def bind(address: Address) -> socket.socket:
    """Open and listen on ``address`` (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise UsageError(f"--listen {address}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise UsageError(f"--listen {address}: cannot listen ({exc.strerror or exc})") from None
    return sock


@dataclass(frozen=True)
class ServerLimits:
    #: seconds a client may take to send a request's headers
    header_timeout: float = 10.0
    #: bytes of request line and headers the parser holds before refusing (431/400)
    header_bytes: int = 16 * 1024
    #: connections and requests served at once; beyond it uvicorn answers 503
    max_concurrency: int = 256
    #: seconds an idle keep-alive connection stays open
    keep_alive: int = 5


class _HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus two things:

    * a deadline for a request's headers: from the first byte of a request (or the
      connection, for the first) until its headers are complete.  A slow-header client is
      disconnected instead of holding a slot forever.  One timer per connection checks it
      (re-armed for the deadline it finds), not one per request: a request only notes when
      its headers began (arming and cancelling a timer per request cost more than parsing
      the headers);
    * one write per answer (:class:`_OneWrite`): the answer's head and body go out in one
      segment, not two.
    """

    header_timeout = 10.0
    header_bytes = 16 * 1024

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._pending_header_bytes = 0
        #: the answers holding writes, oldest first (more than one only when pipelined)
        self._unsent: list[_OneWrite] = []
        #: loop time the current request's headers began; None once they are complete
        self._headers_since: float | None = self.loop.time()
        self._deadline: asyncio.TimerHandle | None = self.loop.call_later(
            self.header_timeout, self._check_headers)

    def _check_headers(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        since, now = self._headers_since, self.loop.time()
        if since is not None and now - since >= self.header_timeout:
            self._headers_too_slow()
            return
        due = self.header_timeout if since is None else since + self.header_timeout - now
        self._deadline = self.loop.call_later(due, self._check_headers)

    def _headers_too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._headers_since is not None:  # this request's headers are still incomplete
            self._pending_header_bytes += len(data)
            if self._pending_header_bytes > self.header_bytes:
                self._headers_too_slow()  # too large: the same end as too slow

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._pending_header_bytes = 0
        if self._headers_since is None:
            self._headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._headers_since = None
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, _OneWrite):
            cycle.transport = _OneWrite(  # type: ignore[assignment]
                cycle.transport, self.loop, self._unsent)

    def on_response_complete(self) -> None:
        for answer in self._unsent:  # the answer that completed (and any before it)
            answer.flush()
        self._unsent.clear()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)


class _OneWrite:
    """A request's view of the connection's transport: its writes are held and sent as
    one, when the answer is complete (the protocol flushes then), when the connection is
    closed, or at the latest on the loop's next turn (a ``100 Continue``, an answer in
    several parts).  uvicorn writes an answer's head and its body separately; sent as is,
    that is two segments, two system calls here and two wake-ups in the client."""

    __slots__ = ("_held", "_loop", "_transport", "_unsent")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 unsent: list[_OneWrite]) -> None:
        self._transport, self._loop, self._unsent = transport, loop, unsent
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._unsent.append(self)
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Server(Server):
    """uvicorn's server without its signal handlers (the runner loop owns signals), and
    telling the task group when it listens."""

    task_status: TaskStatus[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets:
            log.info("listening on port %s", sockets[0].getsockname()[1],
                     extra={"action": "http.listening", "port": sockets[0].getsockname()[1]})
        if self.task_status is not None:
            self.task_status.started()


class HttpServer:
    """One listening socket served by uvicorn until :meth:`stop` (drain) or cancellation
    (at once)."""

    def __init__(self, app: ASGIApp, sock: socket.socket, *, grace: float = 30.0,
                 limits: ServerLimits | None = None,
                 protocol: type[_HeaderTimeoutProtocol] | None = None) -> None:
        self.app, self.sock, self.grace = app, sock, grace
        self.limits = limits or ServerLimits()
        #: the HTTP protocol class (a subclass may add to what the app sees)
        self.protocol = protocol or _HeaderTimeoutProtocol
        self._server: _Server | None = None
        self._stop_asked = False
        #: the port listened on (kept: the socket closes when the server stops)
        self.port = int(sock.getsockname()[1])

    def stop(self) -> None:
        """Begin a graceful stop: no new connections; answer what was received."""
        self._stop_asked = True
        if self._server is not None:
            self._server.should_exit = True

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        limits = self.limits
        protocol = type("HeaderTimeoutProtocol", (self.protocol,), {
            "header_timeout": limits.header_timeout, "header_bytes": limits.header_bytes})
        config = Config(
            self.app, http=protocol, ws="none", lifespan="off", interface="asgi3",
            log_config=None, access_log=False, proxy_headers=False, server_header=False,
            limit_concurrency=limits.max_concurrency, timeout_keep_alive=limits.keep_alive,
            timeout_graceful_shutdown=max(1, round(self.grace)),
        )
        _quiet_uvicorn()
        server = self._server = _Server(config)
        server.task_status = task_status
        server.should_exit = self._stop_asked
        try:
            await server.serve(sockets=[self.sock])
        finally:  # no await here: this also runs when the task is cancelled
            _close_now(server)
            self.sock.close()


def _close_now(server: _Server) -> None:
    """After a cancellation (or a normal end): no listener and no connection stays open."""
    server.force_exit = True
    for listener in getattr(server, "servers", []):
        listener.close()
    for connection in list(server.server_state.connections):
        transport: Any = getattr(connection, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.close()


def _quiet_uvicorn() -> None:
    """uvicorn's start/stop chatter stays out of runner's logs; its warnings (a refused
    request, the concurrency bound) go through runner's handler, which prints only the
    message, never a request's content.

    The access log stays off: ``uvicorn.access`` gets no handler, because uvicorn decides
    per connection whether to log access lines by whether that logger has one, and then
    formats every request's line (client address, quoted path) before the level drops
    it."""
    runner_logger = logging.getLogger("runner")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [] if name == "uvicorn.access" else list(runner_logger.handlers)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
