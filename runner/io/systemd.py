"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), issue 19.

systemd passes a unix datagram socket in ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the
abstract namespace) and, with a watchdog, its period in ``$WATCHDOG_USEC`` (for the
process ``$WATCHDOG_PID``, when set).  A message is one datagram of ``KEY=value`` lines.
The protocol is small and fixed (``sd_notify(3)``), so it is written here rather than
pulled in with libsystemd's bindings, which need a C build.

``runner start`` sends ``READY=1`` once the worker lock is held and recovery is done;
``STATUS=`` with the counts after every cycle; ``WATCHDOG=1`` after every completed cycle
and, while waiting for the next one, every half period: never from inside a cycle, so a
cycle that hangs (a target that never answers) stops the pings and systemd restarts the
worker.  ``STOPPING=1`` when a stop begins.  Without ``$NOTIFY_SOCKET`` nothing is sent.
A failed send is ignored, as ``sd_notify`` does: the supervisor's trouble must not stop
delivery.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping

import anyio

SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


class Notifier:
    """Sends notify messages; every method is a no-op when there is no socket."""

    def __init__(self, address: str | None, watchdog: float | None = None) -> None:
        self.address = address
        #: the watchdog period in seconds (None: no watchdog)
        self.watchdog = watchdog
        self._next_ping = float("inf")
        self._sock: socket.socket | None = None
        if address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if env is None else env
        raw = env.get(SOCKET_ENV) or None
        address = None if raw is None else ("\0" + raw[1:] if raw.startswith("@") else raw)
        watchdog: float | None = None
        pid = env.get(WATCHDOG_PID_ENV)
        if raw is not None and (pid is None or pid == str(os.getpid())):
            try:
                usec = int(env.get(WATCHDOG_USEC_ENV, "0"))
            except ValueError:
                usec = 0
            watchdog = usec / 1e6 if usec > 0 else None
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        if self._sock is None or self.address is None:
            return
        # sd_notify(3): a notification that cannot be sent is dropped
        with contextlib.suppress(OSError):
            self._sock.sendto("\n".join(lines).encode(), self.address)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
        self.ping()

    def progressed(self, status: str) -> None:
        """A cycle completed: its status, and a watchdog ping."""
        self.send(f"STATUS={status}")
        self.ping()

    def ping(self) -> None:
        if self.watchdog is None:
            return
        self.send("WATCHDOG=1")
        self._next_ping = anyio.current_time() + self.watchdog / 2

    def ping_if_due(self) -> None:
        """Between cycles: keep the watchdog fed while the loop waits for the next one."""
        if anyio.current_time() >= self._next_ping:
            self.ping()

    @property
    def next_ping(self) -> float:
        """When the next ping is due (monotonic; inf without a watchdog)."""
        return self._next_ping

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
