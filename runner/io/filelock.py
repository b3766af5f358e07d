"""The worker lock for SQLite stores (SPEC L7): ``flock`` on a file beside the database.

Why a separate file and ``flock``: POSIX record locks (``fcntl``/``lockf``) belong to the
process and vanish when *any* descriptor of the file is closed — including SQLite's own
descriptors of the database — so locking the database file itself would silently drop
SQLite's locks or ours.  ``flock`` locks belong to the open file description, are
released by the kernel when the holder dies (so a crashed worker never leaves a stale
lock), and are not shared with SQLite.

Non-blocking: a second worker is refused at once (exit 75) with the holder's pid, which
the holder writes into the file after it has the lock.  Local locking cannot fence a
request that a target has already accepted from a worker that is gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

import anyio

from runner.errors import LockHeld, StoreError, UnsafeLocation


class FileLock:
    """An exclusive, non-blocking, process-lifetime lock on ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeLocation(f"refusing a symlinked lock file {self.path!r}") from None
            raise StoreError(f"cannot open lock file {self.path!r}: {exc.strerror}") from None
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise LockHeld(
                f"another worker ({who}) holds the lock {self.path!r}; not starting",
                holder_pid=holder,
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {self.path!r}: {exc.strerror}") from None
        self._fd = fd
        # the pid is only for the refusal message: a full disk must not lose the lock
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the description releases the flock

    @property
    def lost(self) -> bool:
        """A lock held by this process is never lost under it (``runner.store.WorkerLock``)."""
        return False

    async def wait_lost(self) -> None:
        await anyio.sleep_forever()

    async def regain(self) -> bool:
        """Still held (a file lock has no session to lose): nothing to take again."""
        return self.held

    async def __aenter__(self) -> FileLock:
        self.acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_path_for(db_path: str) -> str:
    return os.path.abspath(db_path) + ".lock"


def probe(db_path: str) -> None:
    """Raise LockHeld at once if a live worker holds the lock of ``db_path``'s store;
    else return, holding nothing.  A worker calls this before it opens the store, so a
    second worker is refused whatever the store's own state (a first worker stopped with
    SIGSTOP in the middle of a commit keeps the store locked, not the lock file).
    Creates nothing: no lock file, no worker."""
    path = lock_path_for(db_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (no worker yet), or one the real acquire will refuse
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        who = f"pid {holder}" if holder else "another process"
        raise LockHeld(f"another worker ({who}) holds the lock {path!r}; not starting",
                       holder_pid=holder) from None
    except OSError:
        return
    finally:
        os.close(fd)  # closing the description releases a lock taken here


def holder(db_path: str) -> tuple[int, str] | None:
    """The pid written in the lock file of ``db_path``'s store and that process's state
    (``running``, ``stopped``, …), if a live process holds the lock; else None.  Read
    only: it takes no lock."""
    path = lock_path_for(db_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
        else:
            return None  # nobody holds it
        return (pid, process_state(pid)) if pid else None
    finally:
        os.close(fd)


#: /proc/PID/stat state letters, in words
_STATES = {"R": "running", "S": "sleeping", "D": "waiting on the disk", "T": "stopped",
           "t": "stopped by a debugger", "Z": "a zombie"}


def process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return "unknown"
    # the state follows the command name, which is in parentheses and may hold spaces
    letter = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""
    return _STATES.get(letter, "unknown")
