"""A loopback TCP proxy in front of a PostgreSQL server that can lose an INSERT's answer
after the server committed it: the "applied, then the answer lost" moments of a real
server, provoked without touching the server.

It forwards the client's bytes as they come and reads the server's side message by
message (the v3 protocol: a type byte, a length, a body).  Its ``mode``:

* ``pass``: forwards everything;
* ``drop``: at an ``INSERT``'s CommandComplete it keeps the server's answer back; at the
  ReadyForQuery that follows (the implicit transaction has committed by then) it sets
  ``committed`` and closes both connections, so the client sees the connection lost after
  the server applied its statement;
* ``hold``: as ``drop``, but keeps the connection open, answering nothing, until
  ``release`` is set (then drops it): a server that applied the batch and answers after
  the client's timeout, or a test that acts at that moment (stops the server) and then
  lets go.

``on=b"COMMIT"`` (with ``skip``: the first ones pass) interferes with an explicit
transaction's COMMIT instead of an INSERT's answer: a marked batch of the table target is
one such transaction (its rows and its mark), and so is the fence every start raises.
``statement=b"INSERT INTO"`` interferes instead with the answer to an execution of a
prepared statement whose SQL holds those bytes, whatever its command tag (the proxy reads
the client's Parse and Bind messages too): the table target's batch statement is an
INSERT inside a ``WITH`` that answers with the batch's rows, tagged ``SELECT``.

Give the client ``sslmode=disable`` (the proxy reads the plain protocol; it still passes
a refused SSL request's one-byte answer).  Only the first INSERT of the proxy's life is
interfered with unless ``every`` is set.

:meth:`PgProxy.cut` is a server gone away as its clients see it, without touching the
server: every connection through the proxy is closed (the server ends those sessions,
and the locks they held) and every new one is closed before it reaches the server, until
:meth:`PgProxy.restore`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Literal

Mode = Literal["pass", "drop", "hold"]


class PgProxy:
    def __init__(self, upstream_port: int, mode: Mode = "pass", *, every: bool = False,
                 upstream_host: str = "127.0.0.1", on: bytes = b"INSERT",
                 skip: int = 0, statement: bytes | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = mode
        self.every = every
        #: the command whose completion is interfered with (``INSERT``: a statement in
        #: its own implicit transaction; ``COMMIT``: an explicit transaction's end, as a
        #: marked batch's), after ``skip`` of them passed
        self.on, self.skip, self.statement = on, skip, statement
        self.committed = threading.Event()
        self.release = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._fired = False
        self._down = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def dsn(self, user: str, database: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}?sslmode=disable"

    def close(self) -> None:
        self._closing.set()
        self.release.set()
        _shut(self._listener)  # shutdown wakes the accept() blocked in the thread
        with self._lock:
            for sock in self._sockets:
                _shut(sock)
        self._thread.join(5)

    def cut(self) -> None:
        """Close every connection and take no new one (closed at once) until restored."""
        self._down.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def restore(self) -> None:
        self._down.clear()

    def __enter__(self) -> PgProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- connections ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                _shut(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _shut(client)
                continue
            for sock in (client, server):  # message by message: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            executing = threading.Event()  # an execution of ``statement`` is answered next
            threading.Thread(target=self._pump_up, args=(client, server, executing),
                             daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client, executing),
                             daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket,
                 executing: threading.Event) -> None:
        """The client's bytes to the server, as they come (with ``statement``: message by
        message, noting a Bind of a statement whose SQL holds it before passing it on)."""
        with contextlib.suppress(OSError, EOFError):
            if self.statement is None:
                while data := client.recv(65536):
                    server.sendall(data)
            else:
                self._statements_up(_Reader(client), server, executing)
        _shut(server)

    def _statements_up(self, reader: _Reader, server: socket.socket,
                       executing: threading.Event) -> None:
        # the start-up messages have no type byte: an SSL or GSS request (answered 'N'),
        # then the StartupMessage; every message after them has one
        while True:
            (length, code) = struct.unpack("!II", reader.peek(8))
            server.sendall(reader.take(length))
            if code not in (80877103, 80877104):
                break
        tracked: set[bytes] = set()
        assert self.statement is not None
        while True:
            kind, message = reader.message()
            if kind == b"P":  # Parse: a statement's name and its SQL
                name, _, rest = message[5:].partition(b"\0")
                tracked.discard(name)
                if self.statement in rest.partition(b"\0")[0]:
                    tracked.add(name)
            elif kind == b"B":  # Bind: a portal of a statement, by name
                name = message[5:].partition(b"\0")[2].partition(b"\0")[0]
                if name in tracked:
                    executing.set()
            server.sendall(message)

    def _answers(self, message: bytes, executing: threading.Event) -> bool:
        """Whether a CommandComplete is the answer interfered with: its tag begins with
        ``on``; with ``statement``, it ends an execution of that statement."""
        if self.statement is None:
            return message[5:].startswith(self.on)
        if not executing.is_set():
            return False
        executing.clear()
        return True

    def _arm(self) -> bool:
        """Whether this INSERT's answer is to be lost (the first one, or every one)."""
        with self._lock:
            if self.mode == "pass" or (self._fired and not self.every):
                return False
            if self.skip:
                self.skip -= 1
                return False
            self._fired = True
            return True

    def _pump_down(self, server: socket.socket, client: socket.socket,
                   executing: threading.Event) -> None:
        """The server's messages to the client, losing an INSERT's answer if armed."""
        reader = _Reader(server)
        withholding = False
        try:
            # a refused SSL or GSS request is answered with one byte ('N') before any message
            while reader.peek() == b"N" and not reader.started:
                client.sendall(reader.take(1))
            while True:
                kind, message = reader.message()
                if kind == b"C" and self._answers(message, executing) and self._arm():
                    withholding = True
                if not withholding:
                    client.sendall(message)
                    continue
                if kind == b"Z":  # ReadyForQuery: the implicit transaction has committed
                    self.committed.set()
                    if self.mode == "hold":
                        while not self.release.wait(0.05):
                            if self._closing.is_set():
                                break
                    break
        except (OSError, EOFError):
            pass
        finally:
            _shut(client)
            _shut(server)


class _Reader:
    """Whole protocol messages from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.started = False

    def _fill(self, n: int) -> None:
        while len(self.buffer) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data

    def peek(self, n: int = 1) -> bytes:
        self._fill(n)
        return self.buffer[:n]

    def take(self, n: int) -> bytes:
        self._fill(n)
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def message(self) -> tuple[bytes, bytes]:
        """(type byte, the whole message: type, length and body)."""
        self.started = True
        self._fill(5)
        (length,) = struct.unpack("!I", self.buffer[1:5])
        whole = self.take(1 + length)
        return whole[:1], whole


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def pg_proxy(upstream_port: int, mode: Mode = "pass", **kw: bool) -> Iterator[PgProxy]:
    proxy = PgProxy(upstream_port, mode, **kw)
    try:
        yield proxy
    finally:
        proxy.close()
