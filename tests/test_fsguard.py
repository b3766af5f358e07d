"""Where a store may live (K7): network filesystems, directory permissions, foreign files.

File modes and symlinked paths are tested for every command in ``test_privacy.py``."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from runner.io.fsguard import is_network_fstype, mount_for, parse_mountinfo
from tests.helpers import SCOPE, event, last_json, run_main, write_json

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/share rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2
41 22 0:36 / /mnt/smb rw - cifs //host/share rw
42 22 0:37 / /mnt/ssh rw - fuse.sshfs user@host: rw
43 40 8:2 / /mnt/share/local rw - ext4 /dev/sdb1 rw
44 22 0:38 / /mnt/with\\040space rw - nfs host:/x rw
"""


def test_parse_and_match_mounts() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m.fstype for m in mounts] == ["ext4", "nfs4", "cifs", "fuse.sshfs", "ext4", "nfs"]
    assert mount_for("/mnt/share/x/y", mounts).fstype == "nfs4"  # type: ignore[union-attr]
    assert mount_for("/mnt/share/local/db", mounts).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_for("/mnt/sharefoo", mounts).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_for("/mnt/with space/q", mounts).fstype == "nfs"  # type: ignore[union-attr]
    assert mount_for("/home/u", mounts).mount_point == "/"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fstype", "network"),
    [("nfs", True), ("nfs4", True), ("cifs", True), ("smb3", True), ("fuse.sshfs", True),
     ("fuse", True), ("ext4", False), ("xfs", False), ("tmpfs", False), ("overlay", False)],
)
def test_network_fstypes(fstype: str, network: bool) -> None:
    assert is_network_fstype(fstype) is network


def _accept(workdir: Path, db: Path, env: dict[str, str] | None = None):
    scope = write_json(workdir / "scope.json", SCOPE)
    record = write_json(workdir / "event.json", event(1))
    return run_main("accept", "--db", db, "--scope", scope, "--record", record, env=env)


@pytest.mark.parametrize("fstype", ["nfs4", "cifs", "fuse.sshfs"])
def test_store_on_a_network_filesystem_is_refused(workdir: Path, fstype: str) -> None:
    fake = workdir / "mountinfo"
    fake.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"40 22 0:35 / {workdir} rw - {fstype} server:/export rw\n"
    )
    db = workdir / "queue.db"
    proc = _accept(workdir, db, env={"RUNNER_MOUNTINFO": str(fake)})
    assert proc.returncode == 77, proc.stderr
    assert "network filesystem" in proc.stderr and fstype in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not db.exists()


def test_directory_others_can_write_is_refused(workdir: Path) -> None:
    shared = workdir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    proc = _accept(workdir, shared / "queue.db")
    assert proc.returncode == 77 and "other users can write" in proc.stderr
    assert not (shared / "queue.db").exists()


def test_sticky_world_writable_directory_only_warns(workdir: Path) -> None:
    sticky = workdir / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    proc = _accept(workdir, sticky / "queue.db")
    assert proc.returncode == 0, proc.stderr
    assert "not private" in proc.stderr


def test_readable_directory_warns_private_does_not(workdir: Path) -> None:
    group = workdir / "group"
    group.mkdir()
    os.chmod(group, 0o750)
    assert "not private" in _accept(workdir, group / "queue.db").stderr
    assert "not private" not in _accept(workdir, workdir / "queue.db").stderr


def test_zero_byte_file_counts_as_new(workdir: Path) -> None:
    db = workdir / "queue.db"
    db.touch(mode=0o600)
    proc = _accept(workdir, db)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["result"] == "accepted"


def test_a_foreign_sqlite_file_is_not_taken_over(workdir: Path) -> None:
    db = workdir / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE mine (x)")
    conn.commit()
    conn.close()
    os.chmod(db, 0o600)
    proc = _accept(workdir, db)
    assert proc.returncode == 74 and "not a runner store" in proc.stderr
    conn = sqlite3.connect(db)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["mine"]
    conn.close()
