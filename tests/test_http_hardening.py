"""Hardening of the HTTP edge (issue 18 point 5), over real sockets: header and body read
timeouts, the header size bound, the concurrency bound, and no secret or contact alias in
any log line or error body."""

from __future__ import annotations

import logging

import anyio
import pytest

from tests.helpers import CANARY, event
from tests.httpkit import SECRET, TOKEN, body_of, serving, signed, wait_until

pytestmark = pytest.mark.timeout(60)


async def _connect(port: int) -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", port)


async def _read_all(stream: anyio.abc.SocketStream) -> bytes:
    data = b""
    with anyio.fail_after(20):
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return data
            data += chunk


async def test_a_client_trickling_headers_is_disconnected(db_location: str) -> None:
    async with serving(db_location, timeout=0.5) as s:
        stream = await _connect(s.port)
        await stream.send(b"POST /webhook HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        assert await _read_all(stream) == b""  # closed, no request was ever made
        await stream.aclose()
        assert (await s.get("/healthz")).status_code == 200


async def test_oversized_headers_are_refused(db_location: str) -> None:
    async with serving(db_location) as s:
        stream = await _connect(s.port)
        await stream.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(40):
                await stream.send(b"X-Padding: " + b"a" * 1000 + b"\r\n")
            await stream.send(b"\r\n")
        except anyio.BrokenResourceError:
            answer = b""  # the server closed the connection under the sender
        else:
            answer = await _read_all(stream)
        assert b"200 OK" not in answer
        await stream.aclose()


async def test_a_body_slower_than_the_timeout_is_408(db_location: str) -> None:
    async with serving(db_location, timeout=0.5) as s:
        body = body_of(event(1))
        stream = await _connect(s.port)
        head = (f"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                f"X-Hub-Signature-256: {signed(body)['X-Hub-Signature-256']}\r\n\r\n")
        await stream.send(head.encode() + body[:10])
        answer = await _read_all(stream)
        assert answer.startswith(b"HTTP/1.1 408")
        await stream.aclose()
        assert [r async for r in s.worker.store.iter_records()] == []


def _head(body: bytes, *extra: str) -> bytes:
    lines = ["POST /webhook HTTP/1.1", "Host: x", f"Content-Length: {len(body)}",
             f"X-Hub-Signature-256: {signed(body)['X-Hub-Signature-256']}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Answers:
    """Answers with a Content-Length body, read one by one from a keep-alive connection
    (bytes of the next answer read with one are kept for it)."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream, self.data = stream, b""

    async def next(self) -> bytes:
        with anyio.fail_after(20):
            while b"\r\n\r\n" not in self.data:
                self.data += await self.stream.receive()
            head, _, rest = self.data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += await self.stream.receive()
        self.data = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]


async def test_a_body_arriving_after_its_headers_is_waited_for(db_location: str) -> None:
    """The body read's slow path: the app finds no body yet, waits (with its deadline),
    and answers once the rest arrives."""
    async with serving(db_location) as s:
        body = body_of(event(1))
        tasks = s.service.server._server.server_state.tasks  # type: ignore[union-attr]
        stream = await _connect(s.port)
        await stream.send(_head(body) + body[:10])
        await wait_until(lambda: len(tasks) == 1)  # the request is in the app, waiting
        await stream.send(body[10:])
        answer = await _Answers(stream).next()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"result":"accepted"' in answer
        await stream.aclose()
        assert [r.source_lead_id async for r in s.worker.store.iter_records()] == ["lead-1"]


async def test_expect_100_continue_is_answered_before_the_body(db_location: str) -> None:
    """A sender that waits for ``100 Continue`` gets it (answers are written as one, but
    an interim line is not held back until the final answer)."""
    async with serving(db_location) as s:
        body = body_of(event(1))
        stream = await _connect(s.port)
        await stream.send(_head(body, "Expect: 100-continue"))
        interim = b""
        with anyio.fail_after(20):
            while b"\r\n\r\n" not in interim:
                interim += await stream.receive()
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await stream.send(body)
        assert (await _Answers(stream).next()).startswith(b"HTTP/1.1 200")
        await stream.aclose()


async def test_keep_alive_requests_each_get_one_whole_answer(db_location: str) -> None:
    async with serving(db_location) as s:
        stream = await _connect(s.port)
        answers = _Answers(stream)
        for i in range(3):
            body = body_of(event(i))
            await stream.send(_head(body) + body)
            answer = await answers.next()
            assert answer.startswith(b"HTTP/1.1 200") and f'"lead-{i}"'.encode() in answer
        await stream.aclose()


async def test_pipelined_requests_are_answered_in_order(db_location: str) -> None:
    async with serving(db_location) as s:
        stream = await _connect(s.port)
        bodies = [body_of(event(i)) for i in range(3)]
        await stream.send(b"".join(_head(body) + body for body in bodies))
        answers = _Answers(stream)
        for i in range(3):
            answer = await answers.next()
            assert answer.startswith(b"HTTP/1.1 200") and f'"lead-{i}"'.encode() in answer
        await stream.aclose()


def test_an_answer_is_written_once_and_before_a_close() -> None:
    import asyncio

    from runner.io.http.server import _OneWrite

    class Transport:
        def __init__(self) -> None:
            self.writes: list[bytes] = []
            self.closed = False

        def write(self, data: bytes) -> None:
            self.writes.append(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    loop = asyncio.new_event_loop()
    try:
        transport = Transport()
        unsent: list[_OneWrite] = []
        one = _OneWrite(transport, loop, unsent)  # type: ignore[arg-type]
        one.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        one.write(b"{}")
        assert transport.writes == [] and unsent == [one]
        one.flush()
        assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        one.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        one.close()
        assert transport.writes[1:] == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"]
        assert transport.closed
        one.write(b"late")
        loop.run_until_complete(asyncio.sleep(0))  # the next-turn flush: the transport closed
        assert len(transport.writes) == 2
    finally:
        loop.close()


async def test_a_receive_that_would_wait_is_closed_where_it_waits() -> None:
    import asyncio

    from runner.io.http.app import completed_at_once

    ready = asyncio.Event()  # what uvicorn's receive waits on
    stopped: list[str] = []

    async def receive() -> dict[str, object]:
        try:
            await ready.wait()
        except GeneratorExit:
            stopped.append("closed")
            raise
        return {"type": "http.request", "body": b"x", "more_body": False}

    assert completed_at_once(receive()) is None
    assert stopped == ["closed"]
    ready.set()
    assert completed_at_once(receive()) == {"type": "http.request", "body": b"x",
                                            "more_body": False}


async def test_requests_beyond_the_concurrency_bound_get_503(db_location: str) -> None:
    async with serving(db_location, max_concurrency=2) as s:
        held = [await _connect(s.port) for _ in range(2)]
        try:
            response = await s.get("/healthz")
            assert response.status_code == 503
        finally:
            for stream in held:
                await stream.aclose()
        async def healthy() -> bool:
            return (await s.get("/healthz")).status_code == 200

        await wait_until(healthy)  # the slots free once the connections close


async def test_no_secret_token_or_alias_in_logs_or_error_bodies(
        db_location: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bodies: list[str] = []
    async with serving(db_location) as s:
        good = body_of(event(1, contact_alias=CANARY))
        for body, headers in [
            (good, signed(good)),
            (good, signed(good, b"wrong")),
            (good, {"X-Hub-Signature-256": "sha256=" + SECRET.hex()}),
            (body_of(event(1, contact_alias=CANARY + "2")),
             signed(body_of(event(1, contact_alias=CANARY + "2")))),
            (body_of(event(2, contact_alias=CANARY, tenant_id="t")),
             signed(body_of(event(2, contact_alias=CANARY, tenant_id="t")))),
            (b'{"contact_alias": "' + CANARY.encode() + b'"',
             signed(b'{"contact_alias": "' + CANARY.encode() + b'"')),
        ]:
            bodies.append((await s.post(body, headers=headers)).text)
        bodies.append((await s.get("/webhook", params={"hub.mode": "subscribe",
                                                       "hub.verify_token": TOKEN + "x",
                                                       "hub.challenge": "1"})).text)
        bodies.append((await s.get("/metrics")).text)
    ours = [r for r in caplog.records if r.name.startswith(("runner", "uvicorn"))]
    assert ours  # the 403s and the rejections were logged
    seen = "\n".join(bodies) + "\n".join(r.getMessage() + str(vars(r)) for r in ours)
    for secret in (CANARY, SECRET.decode(), SECRET.hex(), TOKEN):
        assert secret not in seen


def test_the_socket_helper_refuses_a_busy_port() -> None:
    from runner.errors import UsageError
    from runner.io.http.server import Address, bind

    sock = bind(Address("127.0.0.1", 0))
    try:
        with pytest.raises(UsageError, match="cannot listen"):
            bind(Address("127.0.0.1", sock.getsockname()[1]))
    finally:
        sock.close()


@pytest.mark.parametrize(("text", "host", "port", "loopback"), [
    ("8080", "127.0.0.1", 8080, True),
    (":8080", "127.0.0.1", 8080, True),
    ("127.0.0.1:0", "127.0.0.1", 0, True),
    ("localhost:9", "localhost", 9, True),
    ("[::1]:8080", "::1", 8080, True),
    ("0.0.0.0:8080", "0.0.0.0", 8080, False),
    ("192.0.2.10:80", "192.0.2.10", 80, False),
    ("example.test:80", "example.test", 80, False),
])
def test_listen_addresses(text: str, host: str, port: int, loopback: bool) -> None:
    from runner.io.http.server import parse_address

    address = parse_address(text)
    assert (address.host, address.port, address.loopback) == (host, port, loopback)


@pytest.mark.parametrize("text", ["", "127.0.0.1:", "host:http", "127.0.0.1:65536"])
def test_bad_listen_addresses_are_usage_errors(text: str) -> None:
    from runner.errors import UsageError
    from runner.io.http.server import parse_address

    with pytest.raises(UsageError):
        parse_address(text)
