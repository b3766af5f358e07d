"""The ASGI application of the HTTP edge: a plain ASGI callable, no framework.

Four routes and nothing else, so a framework would add import time and indirection
without removing code: ``/webhook`` (GET handshake, POST intake), ``/metrics``,
``/healthz``, ``/readyz``.

Intake answers only after the commit (SPEC L3, E4)::

    200  every record accepted or a duplicate (committed)
    400  the body (or an NDJSON line) is not JSON
    401  no X-Hub-Signature-256 header              nothing is read further or stored
    403  a wrong signature, or no secret configured  nothing is parsed or stored
    408  the body did not arrive within the read timeout
    409  a record conflicts with one stored under its key
    413  the body is larger than the limit
    422  a record is invalid or outside the scope (reasons as ``accept``)
    503  the store is unavailable, busy or full, or the process is stopping, or (with
         --require-synchronous-replication) replication is not synchronous; with
         Retry-After, so the sender retries (a retry is safe: a stored record answers
         ``duplicate``)

The body is runner's event JSON: one object (any content type), or NDJSON (content type
``application/x-ndjson``) answered with one JSON line per record, in order.  The status
code of an NDJSON request is the most serious of its lines (400 > 413 > 422 > 409 > 200);
each line says what happened to its record.  One-object requests arriving together share
group commits (``runner.leads.intake.Intake``); an NDJSON request is one commit.

Error bodies are ``{"error": reason, "message": text}``: fixed texts, never a header, the
secret, the token or a contact field.

A refusal of the signature check (401, 403) writes one warning line by reason
(``http.refused``: ``unsigned``, ``bad_signature``, ``unconfigured``, ``handshake``),
rate-limited per reason (``runner.logs.Repeats``: the first, then at most one a minute
saying how many were left out), so a flood of bad requests cannot fill the disk.  The
line names the reason and the status only: never the sender's address, a header or the
body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from types import CoroutineType
from typing import Any, Protocol

import anyio

from runner.errors import BadInputError, LockHeld, NotSynchronous, StoreError
from runner.io.http import auth, health
from runner.jsonio import dumps_line, parse_object
from runner.leads.intake import AcceptResult, rejected
from runner.logs import Repeats

log = logging.getLogger("runner.http")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"
NDJSON = b"application/x-ndjson"
_NDJSON_TYPES = (b"application/x-ndjson", b"application/jsonl", b"application/ndjson")
#: status code per rejection reason; any other reason is 422
_REASON_STATUS = {"invalid_json": 400, "too_large": 413, "conflict": 409}
#: most serious first, for an NDJSON request's status line
_SEVERITY = (400, 413, 422, 409, 200)
#: how much of an oversized body is read and dropped before the 413 is sent
DRAIN_BYTES = 1 << 20
#: seconds between two log lines of one refusal reason (401/403)
REFUSAL_LOG_WINDOW = 60.0


class IntakePort(Protocol):
    """What intake needs (``runner.leads.intake.Intake``): one record, grouped with concurrent
    callers into shared commits; or a batch in one commit."""

    async def accept(self, data: Mapping[str, Any]) -> AcceptResult: ...

    async def accept_batch(
        self, docs: Sequence[Mapping[str, Any] | BadInputError]
    ) -> list[AcceptResult]: ...


class MetricsPort(Protocol):
    def request(self, route: str, code: int, seconds: float) -> None: ...

    def accepted(self, results: Sequence[AcceptResult]) -> None: ...

    async def render(self) -> tuple[bytes, str]: ...


class Limits:
    """The hardening settings of the app (the server adds header timeouts and the
    concurrency bound)."""

    def __init__(self, *, body_bytes: int = 1 << 20, body_timeout: float = 10.0,
                 retry_after: int = 5) -> None:
        self.body_bytes = body_bytes
        self.body_timeout = body_timeout
        self.retry_after = retry_after


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, content_type: bytes = JSON,
                 extra: Headers | None = None) -> None:
        self.status = status
        self.body = body
        self.headers: Headers = [(b"content-type", content_type),
                                 (b"content-length", str(len(body)).encode()),
                                 *(extra or [])]


def error(status: int, reason: str, message: str, extra: Headers | None = None) -> Response:
    return Response(status, dumps_line({"error": reason, "message": message}).encode() + b"\n",
                    extra=extra)


def status_of(result: AcceptResult) -> int:
    if result.ok:
        return 200
    return _REASON_STATUS.get(result.reason or "", 422)


class _Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


class _TooLarge:
    """What :meth:`_Body.take` returns when the body is over the limit."""


_TOO_LARGE = _TooLarge()


class _Body:
    """A request body gathered from ASGI messages, up to a limit."""

    __slots__ = ("chunks", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.limit = limit
        self.size = 0

    def take(self, message: Mapping[str, Any]) -> bytes | _TooLarge | None:
        """The whole body, ``_TOO_LARGE``, or None while more is to come."""
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size <= self.limit:
            self.chunks.append(chunk)
        elif self.size > self.limit + DRAIN_BYTES:
            return _TOO_LARGE
        if message.get("more_body", False):
            return None
        if self.size > self.limit:
            return _TOO_LARGE
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


def completed_at_once(call: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any] | None:
    """The message of a ``receive()`` call if it completes without waiting, else None.

    The call is run one step by hand: if it completes, its message is returned; if it
    would wait, it is closed where it waits (as a cancellation would stop it: uvicorn's
    ``receive`` waits on an event and loses nothing when stopped there), and the caller
    waits for the message with a deadline.
    """
    try:
        call.send(None)
    except StopIteration as done:
        message: dict[str, Any] = done.value
        return message
    call.close()
    return None


class RunnerApp:
    """The ASGI app.  Every collaborator is passed in (no global state)."""

    def __init__(
        self,
        intake: IntakePort,
        webhook: auth.WebhookAuth,
        state: health.LoopState,
        metrics: MetricsPort,
        probe: Callable[[], Awaitable[object]],
        limits: Limits | None = None,
    ) -> None:
        self.intake, self.webhook, self.state = intake, webhook, state
        self.metrics, self.probe = metrics, probe
        self.limits = limits or Limits()
        self._unavailable_headers: Headers = [
            (b"retry-after", str(self.limits.retry_after).encode())]
        #: refusals are logged by reason, at most one line a minute each
        self.refusals = Repeats(REFUSAL_LOG_WINDOW)

    def _refused(self, status: int, reason: str, message: str) -> Response:
        """A 401/403 answer, and its rate-limited log line (the module docstring)."""
        repeated = self.refusals.admit(reason)
        if repeated is not None:
            extra: dict[str, object] = {"action": "http.refused", "reason": reason,
                                        "status": status}
            if repeated:
                extra["repeats"] = repeated
            log.warning("webhook refused (%d): %s", status, message, extra=extra)
        return error(status, "forbidden" if reason in ("unconfigured", "handshake")
                     else reason, message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        began = time.perf_counter()
        path, method = scope["path"], scope["method"]
        try:
            if path == "/webhook" and method == "POST":  # intake: one coroutine frame less
                route, response = "webhook", await self._intake(scope, receive)
            else:
                route, response = await self._route(path, method, scope, receive)
        except _Disconnected:
            return
        await send({"type": "http.response.start", "status": response.status,
                    "headers": response.headers})
        await send({"type": "http.response.body", "body": response.body})
        self.metrics.request(route, response.status, time.perf_counter() - began)

    async def _route(
        self, path: str, method: str, scope: Scope, receive: Receive
    ) -> tuple[str, Response]:
        if path == "/webhook":
            if method == "POST":
                return "webhook", await self._intake(scope, receive)
            if method in ("GET", "HEAD"):
                return "webhook", self._handshake(scope)
            return "webhook", self._not_allowed("GET, POST")
        if path in ("/metrics", "/healthz", "/readyz"):
            route = path[1:]
            if method not in ("GET", "HEAD"):
                return route, self._not_allowed("GET")
            if route == "metrics":
                body, content_type = await self.metrics.render()
                return route, Response(200, body, content_type.encode())
            if route == "healthz":
                ok, doc = health.liveness(self.state, time.monotonic())
            else:
                ok, doc = health.readiness(self.state, await self._store_ok())
            return route, Response(200 if ok else 503, dumps_line(doc).encode() + b"\n")
        return "other", error(404, "not_found", "no such endpoint")

    @staticmethod
    def _not_allowed(allow: str) -> Response:
        return error(405, "method_not_allowed", "method not allowed",
                     [(b"allow", allow.encode())])

    async def _store_ok(self) -> bool:
        try:
            with anyio.fail_after(2.0):
                await self.probe()
        except (TimeoutError, StoreError, LockHeld):
            return False
        return True

    # -- webhook ---------------------------------------------------------------------

    def _handshake(self, scope: Scope) -> Response:
        challenge = auth.handshake(self.webhook, scope.get("query_string", b""))
        if challenge is None:
            return self._refused(403, "handshake", "subscription handshake refused")
        return Response(200, challenge.encode(), b"text/plain; charset=utf-8",
                        [(b"x-content-type-options", b"nosniff")])

    async def _intake(self, scope: Scope, receive: Receive) -> Response:
        headers = dict(scope["headers"])  # the last of a repeated header wins
        signature = headers.get(auth.SIGNATURE_HEADER)
        if self.webhook.secret is None:
            return self._refused(403, "unconfigured",
                                 "webhook intake is not configured (no secret)")
        if signature is None:
            return self._refused(401, "unsigned", "X-Hub-Signature-256 is required")
        if self.state.stopping:
            return error(503, "stopping", "the process is stopping; retry",
                         self._unavailable_headers)
        body = await self._read_body(headers, receive)
        if isinstance(body, Response):
            return body
        verdict = auth.check_signature(self.webhook, signature, body)
        if verdict is not auth.Verdict.VALID:
            return self._refused(403, "bad_signature",
                                 "the signature does not match the body")
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        try:
            if content_type in _NDJSON_TYPES:
                return await self._accept_lines(body)
            return await self._accept_one(body)
        except NotSynchronous as exc:  # --require-synchronous-replication
            log.warning("intake answered 503: %s", exc.reason,
                        extra={"action": "http.unavailable", "reason": exc.reason})
            return error(503, exc.reason, "replication is not synchronous: no event is "
                         "taken (--require-synchronous-replication); retry later",
                         self._unavailable_headers)
        except (StoreError, LockHeld) as exc:  # LockHeld: StoreBusy, the store stayed locked
            log.warning("intake answered 503: %s", exc.reason,
                        extra={"action": "http.unavailable", "reason": exc.reason})
            return error(503, "store_unavailable",
                         "the store could not confirm the commit; retry (a record that "
                         "was stored answers duplicate)", self._unavailable_headers)

    async def _read_body(self, headers: Mapping[bytes, bytes], receive: Receive
                         ) -> bytes | Response:
        """The body, bounded in size and time.  An oversized body is read on and dropped
        (up to ``DRAIN_BYTES`` more) before the 413, so that the client, still sending,
        reads the answer instead of a reset connection.

        The time bound costs something only when there is something to wait for: a
        webhook's body usually arrives with its headers, and then ``receive()`` has it at
        once (:func:`completed_at_once`) and no deadline is armed (an anyio cancel scope
        with a deadline costs more than the signature check and the JSON parse together)."""
        limit = self.limits.body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and not declared.isdigit():
            return error(400, "bad_request", "Content-Length is not a number",
                         [(b"connection", b"close")])
        if declared is not None and int(declared) > limit + DRAIN_BYTES:
            return self._too_large()  # far too large: answer at once, the connection closes
        body = _Body(limit)
        call = receive()
        pending: Awaitable[dict[str, Any]] | None = call
        if isinstance(call, CoroutineType):  # an exact type check: no ABC machinery
            pending = None
            message = completed_at_once(call)
            done = None if message is None else body.take(message)
            if done is not None:
                return done if isinstance(done, bytes) else self._too_large()
        with anyio.move_on_after(self.limits.body_timeout):
            while True:
                done = body.take(await (receive() if pending is None else pending))
                pending = None
                if done is not None:
                    return done if isinstance(done, bytes) else self._too_large()
        return error(408, "body_timeout", "the request body did not arrive in time",
                     [(b"connection", b"close")])

    def _too_large(self) -> Response:
        return error(413, "too_large", f"the body is larger than {self.limits.body_bytes} "
                                       "bytes", [(b"connection", b"close")])

    async def _accept_one(self, body: bytes) -> Response:
        try:
            doc = parse_object(body, what="record")
        except BadInputError as exc:
            result = rejected(None, exc)
        else:
            result = await self.intake.accept(doc)
        self.metrics.accepted((result,))
        return Response(status_of(result), result.to_line().encode() + b"\n")

    async def _accept_lines(self, body: bytes) -> Response:
        docs: list[Mapping[str, Any] | BadInputError] = []
        for line in body.split(b"\n"):
            if not line.strip():
                continue
            try:
                docs.append(parse_object(line, what="record"))
            except BadInputError as exc:
                docs.append(exc)
        if not docs:
            return error(400, "empty", "the body holds no record")
        results = await self.intake.accept_batch(docs)
        self.metrics.accepted(results)
        codes = {status_of(r) for r in results}
        status = next(code for code in _SEVERITY if code in codes)
        text = "".join(r.to_line() + "\n" for r in results)
        return Response(status, text.encode(), NDJSON)
