"""A private PostgreSQL cluster, for tests (and ``harness.pgpair``) that stop, kill or
restart the server.

The shared server (``tests/pg.py``, 127.0.0.1:5432) is never stopped or restarted: a
test that needs the server to go away makes a cluster of its own with the server's own
tools (``initdb``, ``pg_ctl`` from ``/usr/lib/postgresql/*/bin``, or ``$RUNNER_PG_BINDIR``)
in a temporary directory, on a free loopback port, and tears it down completely::

    with private_cluster() as cluster:
        dsn = cluster.dsn("postgres")       # trust auth, superuser cluster.superuser
        cluster.stop("fast")                # or "immediate", or "smart"
        cluster.kill9()                     # SIGKILL the postmaster; returns when it and
                                            # every backend it had are gone
        cluster.start()

Run as root, the tools run as the ``postgres`` user (``runuser -u postgres --``: initdb
refuses root) and the directory belongs to it; run as anyone else, as that user.

A primary/standby pair is built from two of these (``harness.pgpair``): ``settings`` are
added to ``postgresql.conf``, ``pg_hba.conf`` lets loopback replication connections in
(initdb's trust default), :meth:`Cluster.tool` runs any server tool as the cluster's user
(``pg_basebackup``, ``pg_ctl promote``), and :func:`attach` makes a :class:`Cluster` over
a data directory made by such a tool.  This module needs no pytest (``tests/pgcluster.py``
adds the skips and the fixtures); its SQL helpers need asyncpg.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")
BINDIR_ENV = "RUNNER_PG_BINDIR"
#: the OS user the server runs as when the tests run as root
SERVER_USER = "postgres"
StopMode = Literal["smart", "fast", "immediate"]
#: settings every private cluster has: loopback only, quick, small (fsync off: a test
#: kills the server, never the machine, and the OS keeps what was written)
BASE_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "40",
    "shared_buffers": "16MB",
    "log_min_messages": "warning",
}

#: every cluster of this process, torn down at exit if a test did not
_live: list[Cluster] = []


def bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (the newest installed), or None."""
    given = os.environ.get(BINDIR_ENV)
    if given:
        return Path(given)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def server_user() -> str | None:
    """The OS user to run the tools as (None: the current one)."""
    return SERVER_USER if os.geteuid() == 0 else None


def unavailable() -> str | None:
    """Why no private cluster can be made here (None: it can)."""
    if bindir() is None or not (bindir() / "initdb").exists():  # type: ignore[operator]
        return "no PostgreSQL server tools (initdb, pg_ctl); set $RUNNER_PG_BINDIR"
    user = server_user()
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"running as root, and there is no {user!r} user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root, and there is no runuser to run the server as postgres"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the postmaster's backends)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command may hold spaces and parentheses: the fields follow the last ")"
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie is gone for our purpose


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Wait until ``condition()`` is true, checking every 20 ms (TimeoutError after
    ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Cluster:
    """One private cluster: its directory, port and server tools."""

    root: Path
    port: int
    bindir: Path
    user: str | None = None  # the OS user the server runs as (None: this process's)
    settings: dict[str, str] = field(default_factory=dict)
    #: the server's own process while it runs (``start``)
    _server: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    @property
    def superuser(self) -> str:
        return self.user or pwd.getpwuid(os.geteuid()).pw_name

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def dsn(self, database: str = "postgres", *, user: str | None = None,
            **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return (f"postgresql://{user or self.superuser}@{self.address}/{database}"
                + (f"?{query}" if query else ""))

    # -- tools ----------------------------------------------------------------------------

    def tool(self, name: str, *args: str | Path, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a server tool (``initdb``, ``pg_ctl``, ``pg_basebackup`` …) as the
        cluster's user."""
        proc = subprocess.run(self._argv(name, *args), capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.root)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{name} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout)[-800:]}")
        return proc

    def init(self) -> None:
        """``initdb`` (trust auth, UTF8, C locale) and the settings."""
        self.tool("initdb", "-D", self.data, "--auth=trust", "--no-sync", "-E", "UTF8",
                  "--locale=C", "-U", self.superuser)
        self.configure({**BASE_SETTINGS, "unix_socket_directories": f"'{self.root}'",
                        **self.settings})

    def configure(self, settings: Mapping[str, str]) -> None:
        """Add ``settings`` to postgresql.conf (values as the file spells them); read at
        the next start (or ``pg_ctl reload``)."""
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# tests/pgcluster.py\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    # -- running ----------------------------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        pid = int(first) if first.strip().isdigit() else None
        return pid if pid is not None and _alive(pid) else None

    def is_running(self) -> bool:
        return self.postmaster_pid() is not None

    def _argv(self, name: str, *args: str | Path) -> list[str]:
        argv = [str(self.bindir / name), *map(str, args)]
        return ["runuser", "-u", self.user, "--", *argv] if self.user is not None else argv

    def _ready(self) -> bool:
        """The postmaster says it takes connections (postmaster.pid's status line)."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready" and self.is_running()

    def start(self, timeout: float = 60) -> None:
        """Start the server on its port and wait until it takes connections.

        The postmaster runs as a child of this process (under ``runuser`` as root), not
        daemonized by ``pg_ctl start``: a postmaster killed with SIGKILL is then reaped at
        once by its parent, where an orphan could stay a zombie (whose pid a new postmaster
        takes for a live one) until the machine's init reaps it."""
        self._reap()
        with open(self.logfile, "ab") as log:
            self._server = subprocess.Popen(
                self._argv("postgres", "-D", self.data, "-p", str(self.port)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.root, start_new_session=True)
        server = self._server
        try:
            wait_until(lambda: self._ready() or server.poll() is not None, timeout,
                       "the server to take connections")
        except TimeoutError:
            server.kill()
            raise
        if server.poll() is not None:
            self._reap()
            tail = self.logfile.read_text(errors="replace")[-800:]
            raise RuntimeError(f"the server did not start: {tail}")

    def _reap(self, timeout: float = 30) -> None:
        """Wait for the server's own process (runuser, or the postmaster) to be gone."""
        server, self._server = self._server, None
        if server is not None:
            server.wait(timeout)

    def stop(self, mode: StopMode = "fast", timeout: float = 60) -> None:
        """``pg_ctl stop -m MODE`` and wait until the server is down: ``fast`` ends every
        session (their statements fail, their transactions roll back), ``immediate``
        quits at once (crash recovery at the next start), ``smart`` waits for sessions."""
        self.tool("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", str(int(timeout)),
                  "stop", timeout=timeout + 10)
        self._reap()

    def kill9(self, timeout: float = 30) -> None:
        """SIGKILL the postmaster, then wait until it and each backend it had are gone
        (a backend notices its postmaster's death and exits; a new postmaster cannot
        start while one lives)."""
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError("the cluster is not running")
        backends = _children(pid)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_alive(p) for p in [pid, *backends]), timeout,
              "the killed postmaster and its backends to be gone")

    def pause(self) -> None:
        """SIGSTOP the postmaster: its port stays open (the kernel queues connections)
        and nothing answers, as a hung server; sessions already open go on."""
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError("the cluster is not running")
        os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the postmaster, and ``runuser`` around it (which stops itself when its
        child stops, as ``su`` does)."""
        for pid in (self.postmaster_pid(), self._server.pid if self._server else None):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop (``mode``) and start again."""
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        """Stop the server however it is (paused included: immediate, else kill -9) and
        remove every file."""
        with contextlib.suppress(Exception):
            self.resume()
        with contextlib.suppress(Exception):
            if self.is_running():
                try:
                    self.stop("immediate", timeout=20)
                except Exception:  # noqa: BLE001 - any failure: kill it instead
                    self.kill9()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.kill()
                self._reap()
        shutil.rmtree(self.root, ignore_errors=True)
        if self in _live:
            _live.remove(self)

    # -- SQL ------------------------------------------------------------------------------

    def execute(self, sql: str, *args: Any, database: str = "postgres",
                user: str | None = None, timeout: float = 10) -> None:
        """Run ``sql`` (several statements, without ``args``) in its own session."""
        self._session(lambda conn: conn.execute(sql, *args), database, user, timeout)

    def fetch(self, sql: str, *args: Any, database: str = "postgres",
              user: str | None = None, timeout: float = 10) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, run in its own session as ``user`` (default: the
        superuser); ``timeout``: for connecting."""
        rows = self._session(lambda conn: conn.fetch(sql, *args), database, user, timeout)
        return [tuple(row) for row in rows]

    def _session(self, step: Callable[[Any], Awaitable[Any]], database: str,
                 user: str | None, timeout: float) -> Any:
        """``await step(conn)`` on a session of its own (asyncpg, on a loop of its own)."""
        dsn = self.dsn(database, user=user)

        async def go() -> Any:
            import asyncpg

            conn = await asyncpg.connect(dsn, timeout=timeout)
            try:
                return await step(conn)
            finally:
                await conn.close()

        return run_async(go)


def run_async(fn: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    """``await fn()`` on a fresh event loop in a helper thread (so callers may or may not
    have a loop of their own running)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(fn())  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the server within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def directory(user: str | None, root: Path | None = None) -> Path:
    """A new private directory the server's user owns: ``root`` (made, it must not exist
    yet), else a temporary one (under /tmp: a pytest tmp_path of root is not reachable
    for postgres)."""
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="runner-pgcluster-"))
    else:
        root.mkdir(mode=0o700)
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    return root


def make_cluster(settings: Mapping[str, str] | None = None, *, start: bool = True,
                 attempts: int = 3, root: Path | None = None,
                 port: int | None = None) -> Cluster:
    """A new cluster, initialized and (with ``start``) running, in ``root`` (default: a
    temporary directory) on ``port`` (default: a free one); destroy it with
    :meth:`Cluster.destroy` (a cluster left over is destroyed when the process exits,
    unless :func:`keep` was called)."""
    found = bindir()
    assert found is not None, unavailable()
    user = server_user()
    if port is not None:
        attempts = 1
    cluster = Cluster(directory(user, root), port or free_port(), found, user,
                      dict(settings or {}))
    _live.append(cluster)
    try:
        cluster.init()
        for attempt in range(attempts):
            try:
                if start:
                    cluster.start()
                return cluster
            except RuntimeError:
                # the port was taken meanwhile (another process bound it): another one
                if attempt == attempts - 1 or cluster.is_running():
                    raise
                cluster.port = free_port()
        return cluster
    except BaseException:
        cluster.destroy()
        raise


def attach(root: Path, port: int, settings: Mapping[str, str] | None = None) -> Cluster:
    """A :class:`Cluster` over a data directory made otherwise (``root/data``, for
    example by ``pg_basebackup`` for a standby), torn down like the others."""
    found = bindir()
    assert found is not None, unavailable()
    cluster = Cluster(root, port, found, server_user(), dict(settings or {}))
    _live.append(cluster)
    return cluster


def sessions(cluster: Cluster, where: str = "true",
             args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """``pg_stat_activity`` rows (pid, state, wait_event, query) of client sessions
    matching ``where``."""
    return cluster.fetch(
        "SELECT pid, state, wait_event, query FROM pg_stat_activity "
        f"WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND ({where})",
        *args)


def keep(cluster: Cluster) -> None:
    """Leave ``cluster`` running when this process exits (``harness.pgpair up``)."""
    if cluster in _live:
        _live.remove(cluster)


@atexit.register
def _tear_down_leftovers() -> None:
    for cluster in list(_live):
        cluster.destroy()
