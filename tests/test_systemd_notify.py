"""``start`` under a systemd-like supervisor (``Type=notify``): READY=1 once the lock is
held and recovery is done, STATUS= after each cycle, WATCHDOG=1 only while cycles
complete, STOPPING=1 on a stop.  A real unix datagram socket stands in for systemd's
``$NOTIFY_SOCKET``; ``start`` is a real process stopped by a real signal."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from runner.io.systemd import Notifier
from tests.helpers import Child, CliStore, wait_path

#: the watchdog period given to the child (it pings every half period while healthy)
WATCHDOG_S = 0.2


class NotifySocket:
    """The supervisor's end: a bound datagram socket and the messages received."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.messages: list[list[str]] = []

    def receive(self, timeout: float) -> list[str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        message = data.decode().split("\n")
        self.messages.append(message)
        return message

    def wait_for(self, line: Callable[[str], bool], what: str, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None and any(line(x) for x in message):
                return message
        raise AssertionError(f"no {what} within {timeout}s: {self.messages}")

    def during(self, seconds: float) -> list[list[str]]:
        """Every message that arrives within ``seconds`` (an observation window)."""
        got: list[list[str]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None:
                got.append(message)
        return got

    def drain(self) -> None:
        """Receive what is already queued (the child has exited: nothing more comes)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode().split("\n"))
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    # a short path: a unix socket's path is limited to 107 bytes
    with tempfile.TemporaryDirectory(prefix="sd", dir="/tmp") as d:
        sock = NotifySocket(os.path.join(d, "notify"))
        try:
            yield sock
        finally:
            sock.close()


def _start(s: CliStore, notify: NotifySocket, *extra: str) -> Child:
    hang = s.dir / "hang"
    hang.mkdir(exist_ok=True)
    return Child("start", "--db", s.db, "--scope", s.scope, "--target", s.target, *extra,
                 env={"NOTIFY_SOCKET": notify.address,
                      "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6)),
                      "RUNNER_HANG_DIR": str(hang)})


def test_ready_comes_after_recovery_then_status_and_pings_then_stopping(
        cli_store: CliStore, notify: NotifySocket) -> None:
    s = cli_store
    s.accept(1, 2)
    # a crash after the in-flight mark leaves one record in flight: recovery's work
    crashed = s.once("--batch-size", "1", env={"RUNNER_CRASH_AT": "dispatch.after-in-flight"})
    assert crashed.returncode == 73, crashed.stderr
    child = _start(s, notify, "--interval", "0.05")
    try:
        ready = notify.wait_for(lambda x: x == "READY=1", "READY=1")
        assert f"MAINPID={child.proc.pid}" in ready
        assert "STATUS=lock held, 1 recovered" in ready
        notify.wait_for(lambda x: x.startswith("STATUS=cycle 1:"), "a cycle's STATUS")
        notify.wait_for(lambda x: x == "WATCHDOG=1", "a watchdog ping")
        child.signal(signal.SIGTERM)
        stopping = notify.wait_for(lambda x: x == "STOPPING=1", "STOPPING=1")
        assert "STATUS=stopping on SIGTERM" in stopping
        assert child.finish() == 0
    finally:
        child.kill()
    flat = [line for message in notify.messages for line in message]
    assert flat.index("READY=1") < flat.index("STOPPING=1")
    assert flat.count("READY=1") == 1


def test_a_hanging_cycle_stops_the_watchdog_pings(
        cli_store: CliStore, notify: NotifySocket) -> None:
    s = cli_store
    s.accept(1)
    child = _start(s, notify, "--interval", "0.05", "--fault", "hang")
    try:
        notify.wait_for(lambda x: x == "READY=1", "READY=1")
        wait_path(s.dir / "hang" / "entered-write", child)
        notify.drain()  # READY's own ping, sent before the cycle began
        # stuck in the send: for four watchdog periods, not one ping
        window = notify.during(4 * WATCHDOG_S)
        assert not any("WATCHDOG=1" in m for m in window), window
        (s.dir / "hang" / "release").touch()
        # the cycle completes: the pings come back
        notify.wait_for(lambda x: x == "WATCHDOG=1", "a watchdog ping after the release")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0
    finally:
        child.kill()


def test_a_bounded_run_says_stopping_when_its_last_cycle_is_done(
        cli_store: CliStore, notify: NotifySocket) -> None:
    s = cli_store
    s.accept(1)
    child = _start(s, notify, "--cycles", "2", "--interval", "0")
    try:
        assert child.finish() == 0
    finally:
        child.kill()
    notify.drain()
    flat = [line for message in notify.messages for line in message]
    cycles = [x for x in flat if x.startswith("STATUS=cycle")]
    assert cycles[0].startswith("STATUS=cycle 1: 1 sent, 1 confirmed")
    assert len(cycles) == 2
    assert flat[-2:] == ["STOPPING=1", "STATUS=the last cycle is done"]


def test_the_environment_decides_what_is_sent() -> None:
    assert not Notifier.from_env({}).enabled
    name = f"@runner-test-{uuid.uuid4().hex}"
    abstract = NotifySocket(name)
    try:
        notifier = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "500000"})
        assert notifier.watchdog == 0.5
        notifier.send("STATUS=hello")
        assert abstract.receive(5) == ["STATUS=hello"]
        notifier.close()
    finally:
        abstract.close()
    # the watchdog belongs to another process: no pings from this one
    other = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "500000",
                               "WATCHDOG_PID": str(os.getpid() + 1)})
    assert other.enabled and other.watchdog is None
    other.close()
    # a socket nobody listens on: sending is dropped, never an error
    gone = Notifier(os.path.join(tempfile.gettempdir(), f"none-{uuid.uuid4().hex}"))
    gone.send("READY=1")
    gone.close()
