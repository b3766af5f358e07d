"""Where a store may live, and how its files are created (SPEC K7).

Why here and not in SQLite: SQLite's locking is only as good as the filesystem under it.
Network filesystems (NFS, SMB, sshfs and other FUSE mounts) implement POSIX locks loosely
or not at all, so two workers could both believe they hold the store.  We refuse them,
judged from ``/proc/self/mountinfo`` for the database's directory.

Files are created ``0600`` by us with ``O_CREAT | O_EXCL`` *before* SQLite opens them, so
the mode does not depend on the caller's umask; SQLite gives ``-wal`` and ``-shm`` the
database file's mode.  These checks are application checks, not an OS security boundary:
a process of the same user, or root, can still read or change the files.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import NamedTuple

from runner.errors import StoreError, UnsafeLocation, UsageError

log = logging.getLogger("runner.fs")

#: filesystem types whose locking we do not trust
NETWORK_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "9p",
        "ceph", "glusterfs", "lustre", "gfs2", "ocfs2", "davfs", "sshfs", "coda",
    }
)
MOUNTINFO_ENV = "RUNNER_MOUNTINFO"  # test hook: read this file instead of /proc/self/mountinfo


class Mount(NamedTuple):
    """One line of mountinfo: where a filesystem is mounted and its type."""

    mount_point: str
    fstype: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == "\\" and len(digits) == 3 and digits.isdigit():
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse mountinfo lines: ``id parent major:minor root mount-point opts ... - fstype ...``."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 5:
            continue
        sep = fields.index("-")
        if sep + 1 >= len(fields):
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1]))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path`` (longest mount point that is a prefix of it)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        inside = path == point or path.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def is_network_fstype(fstype: str) -> bool:
    base = fstype.split(".", 1)[0]
    return fstype in NETWORK_FSTYPES or base in NETWORK_FSTYPES or base == "fuse"


def _read_mountinfo() -> str:
    source = os.environ.get(MOUNTINFO_ENV, "/proc/self/mountinfo")
    try:
        return Path(source).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""  # not Linux, or no /proc: nothing to judge by


def check_filesystem(directory: str, what: str = "store") -> None:
    mount = mount_for(directory, parse_mountinfo(_read_mountinfo()))
    if mount is not None and is_network_fstype(mount.fstype):
        raise UnsafeLocation(
            f"refusing a {what} on a network filesystem ({mount.fstype} at "
            f"{mount.mount_point}): its locks cannot keep two "
            f"{'workers' if what == 'store' else 'writers'} apart"
        )


def check_directory(directory: str, what: str = "store") -> None:
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        raise UsageError(f"directory {directory!r} does not exist") from None
    mode = info.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise UnsafeLocation(
            f"refusing a {what} in {directory!r}: other users can write to it "
            f"(mode {stat.S_IMODE(mode):o}, no sticky bit); use a private directory"
        )
    if what != "store":
        return  # the privacy advice is about the store's records
    if mode & (stat.S_IRWXG | stat.S_IRWXO) or info.st_uid != os.geteuid():
        log.warning(
            "store directory is not private (mode %o); a private directory (0700) is safer",
            stat.S_IMODE(mode),
            extra={"action": "fs.directory_not_private"},
        )


def check_not_symlink(path: str, what: str = "database path") -> None:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise UnsafeLocation(f"refusing a symlinked {what} {path!r}")
    except FileNotFoundError:
        return


def create_private_file(path: str) -> bool:
    """Create ``path`` as an empty ``0600`` file if it does not exist; True if we made it.

    ``O_EXCL`` makes creation race-free between processes; ``O_NOFOLLOW`` refuses a
    symlink planted at the path.
    """
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLocation(f"refusing a symlinked path {path!r}") from None
        raise StoreError(f"cannot create {path!r}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is filtered by umask; this is not
    finally:
        os.close(fd)
    return True


def prepare_store_path(db: str, *, create: bool) -> str:
    """Check a SQLite store path and, with ``create``, make its file ``0600``.

    Returns the absolute path.  Raises UnsafeLocation / UsageError / StoreError.
    """
    path = os.path.abspath(db)
    check_not_symlink(path)
    directory = os.path.dirname(path)
    check_directory(directory)
    check_filesystem(os.path.realpath(directory))
    for suffix in ("-wal", "-shm", "-journal"):
        check_not_symlink(path + suffix, "database side file")
    if create:
        create_private_file(path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"{db!r} is not a regular file")
    return path


def check_target_path(target: str) -> str:
    """Check where a SQLite target lives, changing nothing; returns the absolute path.

    The same location rules as a store (no symlink, no directory others can write without
    the sticky bit, no network filesystem: the target's write lock is what makes a busy
    target a "not sent"), and a directory that does not exist means no target is there:
    ``TargetAbsent``.  Raises UnsafeLocation / TargetAbsent / TargetUnavailable.
    """
    from runner.errors import TargetAbsent, TargetUnavailable

    path = os.path.abspath(target)
    check_not_symlink(path, "target path")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise TargetAbsent(f"no target at {target!r}: directory {directory!r} does not exist")
    check_directory(directory, "target")
    check_filesystem(os.path.realpath(directory), "target")
    for suffix in ("-wal", "-shm", "-journal"):
        check_not_symlink(path + suffix, "target side file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise TargetUnavailable(f"target {target!r} is not a regular file")
    return path


def same_file(a: str, b: str) -> bool:
    """True when two paths name one file (same path after resolution, or hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
