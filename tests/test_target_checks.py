"""Issue 15 points 1 and 8: a misconfigured target never strands records, and a refusal
changes nothing.

Point 1: whatever can be known before a send (the target opens, can be written, is a
target) is checked before any record is marked in flight; a failure there is one line on
stderr with its exit code (74 unavailable, 77 unsafe location) and changes no record, and
a later good target delivers every record.  Point 8: a foreign SQLite file given as
``--db`` or ``--target`` is left byte for byte as it was, and a target whose lock cannot be
taken before the write starts is "not sent" (failed_safe), never uncertain.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import anyio
import pytest

from runner import BeforeWriteError, DurableWorker
from runner.errors import RunnerError
from runner.io.filelock import FileLock, lock_path_for
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import Observation, TargetRow
from tests.fakes import sheet_rows
from tests.helpers import (
    SCOPE,
    cli,
    digest,
    dump_store,
    event,
    ndjson,
    worker_records,
    write_json,
)

REC = CRMRecord(tenant="t", source="meta", source_lead_id="lead-1", is_test=True,
                contact_alias=None)


def foreign_sqlite(path: Path, *, wal: bool = False) -> Path:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me as I am')")
    conn.commit()
    conn.close()
    path.chmod(0o600)
    return path


class Inbox:
    """A store with three prepared records, driven through ``main`` in process.  Its
    worker lock file exists, as it does once any worker has run: a delivery run takes the
    lock (a second worker is refused by it first, exit 75), then checks the target."""

    def __init__(self, workdir: Path, scope_file: Path, db: str) -> None:
        self.dir, self.db, self.scope = workdir, db, scope_file
        for i in range(3):
            record = write_json(workdir / f"e{i}.json", event(i))
            code, _, err = cli("accept", "--db", db, "--scope", scope_file, "--record", record)
            assert code == 0, err
        if not db.startswith("postgresql://"):
            lock = FileLock(lock_path_for(db))
            lock.acquire()
            lock.release()

    def once(self, target: str | Path) -> tuple[int, str, str]:
        return cli("once", "--db", self.db, "--scope", self.scope, "--target", target)

    def states(self) -> list[str]:
        code, out, err = cli("status", "--db", self.db, "--records")
        assert code == 0, err
        return [r["state"] for r in ndjson(out)]


@pytest.fixture
def inbox(workdir: Path, scope_file: Path, db_location: str) -> Inbox:
    return Inbox(workdir, scope_file, db_location)


def _missing_dir(d: Path) -> Path:
    return d / "nodir" / "t.db"


def _symlink(d: Path) -> Path:
    (d / "real.db").touch(mode=0o600)
    (d / "link.db").symlink_to(d / "real.db")
    return d / "link.db"


def _foreign(d: Path) -> Path:
    return foreign_sqlite(d / "foreign.db")


def _not_sqlite(d: Path) -> Path:
    path = d / "garbage.db"
    path.write_bytes(b"not a database at all\n" * 50)
    path.chmod(0o600)
    return path


def _open_directory(d: Path) -> Path:
    shared = d / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others can write, no sticky bit
    return shared / "t.db"


BAD_TARGETS: dict[str, tuple[Callable[[Path], Path], int, str]] = {
    "missing directory": (_missing_dir, 74, "does not exist"),
    "symlink": (_symlink, 77, "symlinked"),
    "foreign sqlite": (_foreign, 74, "not a target"),
    "not sqlite": (_not_sqlite, 74, "not a SQLite database"),
    "directory others can write": (_open_directory, 77, "other users can write"),
}


@pytest.mark.parametrize("kind", list(BAD_TARGETS))
def test_a_bad_target_is_refused_before_any_record_is_marked(inbox: Inbox, kind: str) -> None:
    make, code, words = BAD_TARGETS[kind]
    target = make(inbox.dir)
    files_before = sorted(p.name for p in target.parent.iterdir()) if target.parent.exists() \
        else None
    content_before = digest(target) if target.is_file() else None
    store_before = dump_store(inbox.db)

    exit_code, out, err = inbox.once(target)

    assert exit_code == code, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert dump_store(inbox.db) == store_before  # no record changed, not even attempts
    if files_before is not None:  # no file created beside it, none changed
        assert sorted(p.name for p in target.parent.iterdir()) == files_before
    if content_before is not None:
        assert digest(target) == content_before

    # a good target later delivers every record: nothing was stranded
    exit_code, out, err = inbox.once(inbox.dir / "good.db")
    assert exit_code == 0, err
    assert json.loads(out)["confirmed"] == 3
    assert inbox.states() == ["confirmed"] * 3
    assert len(sheet_rows(inbox.dir / "good.db")) == 3


@contextlib.contextmanager
def read_only_directory(path: Path) -> Iterator[Path]:
    """A directory nobody can create files in: mode 0500, or for root (who writes through
    any mode) the immutable attribute."""
    path.mkdir(mode=0o500)
    if os.geteuid() != 0:
        yield path
        return
    import shutil
    import subprocess

    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)],
                                        capture_output=True).returncode:
        pytest.skip("root needs chattr +i to have a read-only directory")
    try:
        yield path
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_read_only_target_directory_is_refused_before_any_record_is_marked(
    inbox: Inbox,
) -> None:
    with read_only_directory(inbox.dir / "locked") as locked:
        store_before = dump_store(inbox.db)
        exit_code, _, err = inbox.once(locked / "t.db")
        assert exit_code == 74 and "cannot create the target" in err, err
        assert dump_store(inbox.db) == store_before
        assert list(locked.iterdir()) == []


def test_a_send_that_cannot_open_its_target_is_not_sent(workdir: Path) -> None:
    """The send-time rule, for an adapter used without the checks before work: a target
    that does not even open is a BeforeWriteError (was: a StoreError, so uncertain)."""
    for path in (_missing_dir(workdir), _symlink(workdir), _not_sqlite(workdir)):
        target = SyntheticTarget(str(path))
        with pytest.raises(BeforeWriteError):
            target.write(REC, "w1")
        target.close()


class Unreachable:
    """A user's adapter whose check before writes says the service cannot be reached."""

    def __init__(self) -> None:
        self.writes = 0

    def prepare_writes(self, create: bool) -> None:
        raise BeforeWriteError("the CRM is unreachable")

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.writes += 1

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return []

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        return {}


async def test_a_user_adapter_failing_its_check_stops_the_cycle_changing_nothing(
    db_location: str,
) -> None:
    adapter = Unreachable()
    async with DurableWorker(db_location, SCOPE, adapter) as worker:
        await worker.accept(event(1))
        with pytest.raises(RunnerError, match="unreachable") as refused:
            await worker.run_cycle()
        assert refused.value.exit_code == 74
        records = await worker_records(worker)
    assert adapter.writes == 0
    assert [(r["state"], r["attempts"]) for r in records] == [("prepared", 0)]


# -- point 8: refusals change nothing; bounded waits -----------------------------------


@pytest.mark.parametrize("wal", [False, True], ids=["rollback-journal", "wal"])
def test_a_foreign_sqlite_file_as_db_is_left_byte_for_byte(
    workdir: Path, scope_file: Path, wal: bool
) -> None:
    db = foreign_sqlite(workdir / "foreign.db", wal=wal)
    before, files = digest(db), sorted(os.listdir(workdir))
    code, out, err = cli("once", "--db", db, "--scope", scope_file, "--target",
                         workdir / "t.db")
    assert code == 74 and out == "" and "not a runner store" in err
    assert digest(db) == before  # the journal mode too: it is in the header
    assert sorted(os.listdir(workdir)) == files


@pytest.mark.parametrize("wal", [False, True], ids=["rollback-journal", "wal"])
def test_a_foreign_sqlite_file_as_target_is_left_byte_for_byte(
    inbox: Inbox, wal: bool
) -> None:
    target = foreign_sqlite(inbox.dir / "foreign.db", wal=wal)
    before, files = digest(target), sorted(os.listdir(inbox.dir))
    for command in ("once", "poll-status"):
        code, _, err = cli(command, "--db", inbox.db, "--scope", inbox.scope, "--target",
                           target)
        assert code == (74 if command == "once" else 0), err
        assert digest(target) == before  # no sheet table, no WAL switch
        assert sorted(os.listdir(inbox.dir)) == files  # no -wal, no -shm


def test_a_target_locked_before_the_write_is_not_sent(workdir: Path, db_location: str) -> None:
    """A target that stays locked longer than the busy timeout while its connection is
    open: the write lock is taken before anything is written, so not getting it is "not
    sent" (was: uncertain, no row).  The first write of a run is the fence every start
    raises (SPEC E8): until it stands nothing is marked in flight or sent, the record
    stays prepared, and the next cycle raises it and sends the record."""
    path = workdir / "t.db"
    target = SyntheticTarget(str(path), busy_timeout=0.2)

    async def cycle(i: int | None = None) -> dict[str, int]:
        async with DurableWorker(db_location, SCOPE, target, retry_base=0) as worker:
            if i is not None:
                await worker.accept(event(i))
            return (await worker.run_cycle()).to_json()

    assert anyio.run(cycle, 1)["confirmed"] == 1  # the target's connection is now open
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        summary = anyio.run(cycle, 2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (summary["dispatched"], summary["failed_safe"], summary["uncertain"]) == (0, 0, 0)
    assert [r[4] for r in sheet_rows(path)] == ["lead-1"]
    assert anyio.run(cycle)["confirmed"] == 1
    assert [r[4] for r in sheet_rows(path)] == ["lead-1", "lead-2"]
    target.close()


def test_a_target_on_a_network_filesystem_is_refused_before_any_record_is_marked(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = inbox.dir / "remote"
    remote.mkdir(mode=0o700)
    fake = inbox.dir / "mountinfo"
    fake.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                    f"40 22 0:35 / {remote} rw - nfs4 server:/export rw\n")
    monkeypatch.setenv("RUNNER_MOUNTINFO", str(fake))
    store_before = dump_store(inbox.db)
    code, _, err = inbox.once(remote / "t.db")
    assert code == 77 and "network filesystem" in err, err
    assert dump_store(inbox.db) == store_before
    assert list(remote.iterdir()) == []
