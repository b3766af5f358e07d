"""The worker lock file (L7) when its pid cannot be written."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from runner.errors import LockHeld
from runner.io import filelock
from runner.io.filelock import FileLock


def test_a_full_disk_while_writing_the_pid_still_holds_the_lock(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the issue 8 disk-full test: ``os.pwrite`` failing with ENOSPC escaped as a
    raw OSError (a traceback, exit 1) after the lock had been taken."""

    def no_space(*_args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    path = str(workdir / "queue.db.lock")
    holder = FileLock(path)
    monkeypatch.setattr(filelock.os, "pwrite", no_space)
    holder.acquire()
    try:
        assert holder.held
        with pytest.raises(LockHeld, match="another process"):
            FileLock(path).acquire()
    finally:
        holder.release()
    FileLock(path).acquire()  # released: free again
