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
