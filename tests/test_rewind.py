"""A store that forgot what it sent (SPEC E8, issue 30): restored from a backup, emptied,
deleted; the target's batch marks catch it, and nothing is sent twice.

Each case is run as an operator meets it: commands on a SQLite store and the synthetic
target, the store file replaced between them (a restore is a copy from earlier in the run;
an emptied store a file truncated to 0 bytes; a deleted one, gone with its side files),
then the same events accepted again and ``once``.  The target's rows are counted.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import event, last_json, run_cli, run_main
from tests.targetkit import target_server

pytestmark = pytest.mark.timeout(120)


class Target:
    """Where the leads go: the synthetic target's file, a ``target-serve --marks``
    server (real loopback HTTP), or a table of the PostgreSQL server; each keeps marks."""

    def __init__(self, args: list[str | Path], keys: Callable[[], list[str]]) -> None:
        self.args = args
        self.keys = keys


@pytest.fixture(params=["synthetic", "http", "pgtable"])
def target(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    if request.param == "synthetic":
        path = workdir / "t.db"
        yield Target(["--target", path], lambda: [str(r[4]) for r in sheet_rows(path)])
    elif request.param == "http":
        with target_server(workdir, "--marks") as server:
            yield Target(["--target", server.url],
                         lambda: [str(r[4]) for r in sheet_rows(server.store)])
    else:
        pg.require()
        schema = pg.new_schema()
        pg.execute(f'CREATE SCHEMA "{schema}"')
        yield Target(["--target", pg.dsn(), "--target-table", f"{schema}.leads"],
                     lambda: [str(r[0]) for r in pg.fetch(
                         f'SELECT source_lead_id FROM "{schema}".leads')])
        pg.drop_later([schema])


class Sqlite:
    def __init__(self, workdir: Path, scope_file: Path, target: Target | None = None,
                 db: str | Path | None = None) -> None:
        self.dir = workdir
        self.db: str | Path = db if db is not None else workdir / "q.db"
        self.scope = scope_file
        self.target = workdir / "t.db"
        self.to = target or Target(["--target", self.target],
                                   lambda: [str(r[4]) for r in sheet_rows(self.target)])

    def accept(self, ids: range) -> None:
        feed = self.dir / f"feed-{ids.start}-{ids.stop}.ndjson"
        feed.write_text("".join(json.dumps(event(i)) + "\n" for i in ids))
        proc = run_main("accept", "--db", self.db, "--scope", self.scope, "--records", feed)
        assert proc.returncode == 0, proc.stderr

    def once(self, *extra: str, code: int = 0) -> Any:
        proc = run_main("once", "--db", self.db, "--scope", self.scope, *self.to.args,
                        *extra)
        assert proc.returncode == code, proc.stderr
        return proc

    def backup(self, name: str) -> Path:
        """A consistent copy (the store is closed between commands: one file)."""
        copy = self.dir / name
        shutil.copyfile(Path(self.db), copy)
        return copy

    def restore(self, copy: Path) -> None:
        for side in ("-wal", "-shm"):
            Path(f"{self.db}{side}").unlink(missing_ok=True)
        shutil.copyfile(copy, Path(self.db))

    def records(self) -> dict[str, Any]:
        proc = run_main("status", "--db", self.db, "--records")
        assert proc.returncode == 0, proc.stderr
        return {r["source_lead_id"]: r for r in map(json.loads, proc.stdout.splitlines())}

    def rows_per_key(self) -> Counter[str]:
        return Counter(self.to.keys())


@pytest.fixture
def env(workdir: Path, scope_file: Path) -> Sqlite:
    return Sqlite(workdir, scope_file)


def test_a_store_restored_from_before_its_last_sends_reads_back_and_sends_nothing_twice(
        env: Sqlite) -> None:
    env.accept(range(60))
    backup = env.backup("before-sending.db")  # 60 prepared
    env.once()
    assert env.rows_per_key().total() == 60
    env.restore(backup)  # the store forgot that it sent them all
    proc = env.once()
    assert "store is behind its target" in proc.stderr
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(60)})
    summary = last_json(proc.stdout)
    assert summary["reconciled"] == 60 and summary["dispatched"] == 0
    assert {r["state"] for r in env.records().values()} == {"confirmed"}


def test_a_restored_store_finds_events_accepted_again_under_their_first_write_id(
        workdir: Path, scope_file: Path, target: Target) -> None:
    env = Sqlite(workdir, scope_file, target)
    env.accept(range(30))
    backup = env.backup("half.db")
    env.accept(range(30, 60))
    env.once()
    sent = {r["source_lead_id"]: r["write_id"] for r in env.records().values()}
    env.restore(backup)  # lead-30..59 are gone from the store, not from the target
    env.accept(range(30, 70))  # the lost ones come again (new write_ids), and 10 new
    proc = env.once()
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(70)})
    records = env.records()
    assert {r["state"] for r in records.values()} == {"confirmed"}
    # a record found under the write_id it was first sent with takes that write_id
    assert all(records[key]["write_id"] == write_id for key, write_id in sent.items())
    assert "rewind done" in proc.stderr


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_an_emptied_or_deleted_store_is_refused_until_adopted_then_sends_nothing_twice(
        workdir: Path, scope_file: Path, target: Target, how: str) -> None:
    env = Sqlite(workdir, scope_file, target)
    env.accept(range(40))
    env.once()
    if how == "emptied":
        Path(env.db).write_bytes(b"")
    for side in ("" if how == "deleted" else None, "-wal", "-shm"):
        if side is not None:
            Path(f"{env.db}{side}").unlink(missing_ok=True)
    env.accept(range(45))  # the same events again (new write_ids), and 5 new
    # as an operator runs it: a real process
    refused = run_cli("once", "--db", env.db, "--scope", env.scope, *target.args)
    assert refused.returncode == 78, refused.stderr
    assert "another store" in refused.stderr and "runner target adopt" in refused.stderr
    assert env.rows_per_key().total() == 40  # nothing was sent
    adopted = run_cli("target", "adopt", "--db", env.db, "--scope", env.scope,
                      *target.args, "--reason", "the store file was lost")
    assert adopted.returncode == 0, adopted.stderr
    assert last_json(adopted.stdout)["adopted"]
    env.once()
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(45)})
    assert {r["state"] for r in env.records().values()} == {"confirmed"}


def test_a_rewound_record_whose_row_differs_stays_uncertain(env: Sqlite) -> None:
    import sqlite3

    env.accept(range(5))
    backup = env.backup("b.db")
    env.once()
    with sqlite3.connect(env.target) as conn:  # someone edited a row at the target
        conn.execute("UPDATE sheet SET contact_alias = 'edited' WHERE source_lead_id = 'lead-2'")
    env.restore(backup)
    env.once()
    records = env.records()
    assert records["lead-2"]["state"] == "uncertain"
    assert {records[f"lead-{i}"]["state"] for i in (0, 1, 3, 4)} == {"confirmed"}
    assert env.rows_per_key().total() == 5
    # and it is an ordinary uncertain record from now on: read back, never resent
    env.once()
    assert env.rows_per_key().total() == 5


def test_a_store_that_lost_its_in_flight_marks_resends_only_what_the_target_lacks(
        env: Sqlite) -> None:
    """A promoted standby's view: the store kept its records as prepared, but lost the
    batches it marked; half of them reached the target.  After the fence is raised the
    readback is conclusive: the half the target holds is confirmed, the rest is sent."""
    env.accept(range(40))
    backup = env.backup("lagging.db")
    env.once("--dispatch-limit", "20")
    assert env.rows_per_key().total() == 20
    env.restore(backup)
    proc = env.once()
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(40)})
    summary = last_json(proc.stdout)
    assert summary["reconciled"] == 20 and summary["requeued"] == 20
    assert {r["state"] for r in env.records().values()} == {"confirmed"}


@pytest.mark.parametrize("was", ["asynchronous", "synchronous"])
def test_a_newer_timeline_rewinds_a_store_whose_target_keeps_no_marks(
        workdir: Path, scope_file: Path, was: str) -> None:
    """A promoted standby, as the store sees it: the server is on a newer timeline than
    the one the store last started on (made here by recording an older one).  A target
    without marks cannot fence the forgotten history, so after asynchronous replication
    every record that could have been sent is read back first and one with no row stays
    uncertain for an operator; after synchronous replication nothing was lost."""
    pg.require()
    schema = pg.pooled_schema()
    db = pg.location(schema)
    try:
        with target_server(workdir) as server:  # protocol v2, no --marks
            env = Sqlite(workdir, scope_file, Target(
                ["--target", server.url], lambda: [str(r[4]) for r in sheet_rows(server.store)]),
                db=db)
            env.accept(range(10))
            env.once()
            env.accept(range(10, 15))
            pg.execute(f'UPDATE "{schema}".store_marks SET timeline = 0, replication = $1',
                       was)
            proc = env.once()
            states = Counter(r["state"] for r in env.records().values())
            if was == "asynchronous":
                assert "promoted standby may lack the last commits" in proc.stderr
                assert states == Counter(confirmed=10, uncertain=5)
                assert env.rows_per_key().total() == 10
                settled = run_main("resolve", "--db", db, "--scope", scope_file,
                                   "--target", server.url, "--all", "--as", "not-sent",
                                   "--reason", "the old primary is gone")
                assert settled.returncode == 0, settled.stderr
                env.once()
            else:
                assert "nothing committed was lost" in proc.stderr
            assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(15)})
            assert {r["state"] for r in env.records().values()} == {"confirmed"}
    finally:
        pg.give_back(schema)


async def test_a_batch_refused_as_stale_mid_run_rewinds_under_the_same_lock(
        workdir: Path, scope_file: Path) -> None:
    """Two copies of one store (a copy left running, a restore beside it): the copy passes
    its start check, then the other delivers; the copy's next batch is refused as stale
    (applied nothing), and the copy rewinds before it sends anything else."""
    from runner import DurableWorker
    from runner.io.synthetic_target import SyntheticTarget
    from tests.helpers import SCOPE

    env = Sqlite(workdir, scope_file)
    env.accept(range(20))
    copy = env.backup("copy.db")
    target = SyntheticTarget(str(env.target))
    try:
        async with DurableWorker(str(copy), SCOPE, target) as worker, worker.hold_lock():
            sent = run_cli("once", "--db", env.db, "--scope", env.scope, *env.to.args,
                           "--dispatch-limit", "10")  # the original sends 10 (mark 1.1)
            assert sent.returncode == 0, sent.stderr
            first = await worker.run_cycle()  # the copy's batch 1.1: stale
            assert first.dispatched == 20 and first.failed_safe == 20
            assert env.rows_per_key().total() == 10
            second = await worker.run_cycle()  # rewound: 10 held, 10 sent
            assert (second.reconciled, second.requeued) == (10, 10)
            assert second.confirmed == 10
    finally:
        target.close()
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(20)})


async def test_a_request_still_on_its_way_when_a_restored_copy_starts_never_applies(
        workdir: Path, scope_file: Path) -> None:
    """A worker's batch is on its way (held inside the adapter) when a copy of its store
    from before that batch starts: the copy's start raises the target's fence to a new
    epoch and sends every record; the request on its way then lands and is refused as
    stale, applying nothing."""
    import sqlite3
    import threading

    import anyio

    from runner import DurableWorker
    from runner.io.synthetic_target import SyntheticTarget
    from runner.leads.marks import StaleMark
    from tests.helpers import SCOPE

    class OnItsWay(SyntheticTarget):
        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.entered, self.release = threading.Event(), threading.Event()
            self.raised: BaseException | None = None

        def write_batch(self, items: Any, *, mark: Any = None) -> None:
            self.entered.set()
            assert self.release.wait(60)
            try:
                super().write_batch(items, mark=mark)
            except StaleMark as exc:
                self.raised = exc
                raise

    env = Sqlite(workdir, scope_file)
    env.accept(range(20))
    copy = workdir / "copy.db"
    target = OnItsWay(str(env.target))
    try:
        async with DurableWorker(str(env.db), SCOPE, target) as worker, worker.hold_lock():
            # the copy: after this worker's start (its fence), before its batch
            with sqlite3.connect(env.db) as live, sqlite3.connect(copy) as into:
                live.backup(into)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run_cycle)
                await anyio.to_thread.run_sync(target.entered.wait, 30)
                started = await anyio.to_thread.run_sync(lambda: run_cli(
                    "once", "--db", copy, "--scope", env.scope, "--target", env.target))
                assert started.returncode == 0, started.stderr
                assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(20)})
                target.release.set()
    finally:
        target.close()
    assert isinstance(target.raised, StaleMark)
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(20)})


def test_a_postgresql_store_made_again_adopts_its_target_and_takes_the_write_ids_it_holds(
        workdir: Path, scope_file: Path) -> None:
    """The PostgreSQL side of an emptied store: the schema dropped and made again (a new
    store_id); the events accepted again are found at the target by key, and each record
    takes the write_id the target holds it under (the row guard lets a write_id change
    only with its kept adoption row)."""
    pg.require()
    schema = pg.new_schema()
    db = pg.location(schema)
    try:
        env = Sqlite(workdir, scope_file, db=db)
        env.accept(range(12))
        env.once()
        sent = {r["source_lead_id"]: r["write_id"] for r in env.records().values()}
        pg.execute(f'DROP SCHEMA "{schema}" CASCADE')
        env.accept(range(15))
        refused = run_main("once", "--db", db, "--scope", scope_file, *env.to.args)
        assert refused.returncode == 78, refused.stderr
        adopted = run_main("target", "adopt", "--db", db, "--scope", scope_file,
                           *env.to.args, "--reason", "the schema was dropped")
        assert adopted.returncode == 0, adopted.stderr
        env.once()
        records = env.records()
        assert {r["state"] for r in records.values()} == {"confirmed"}
        assert all(records[key]["write_id"] == w for key, w in sent.items())
        assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(15)})
        kinds = [r[0] for r in pg.fetch(f'SELECT kind FROM "{schema}".outbox')]
        assert kinds.count("write_id_adopted") == 12 and kinds.count("target_adopted") == 1
        assert kinds.count("store_rewind") == 1
    finally:
        pg.drop_later([schema])


def test_an_event_the_store_forgot_that_comes_again_after_the_rewind_is_found_by_key(
        env: Sqlite) -> None:
    """The restored store rewinds at its first run; the source sends the lost events again
    only later (new write_ids).  Within a day of the rewind every record is looked up by
    key before it is sent, so the events the forgotten history delivered are confirmed
    under their first write_ids, not sent twice."""
    env.accept(range(10))
    backup = env.backup("early.db")
    env.accept(range(10, 20))
    env.once()
    env.restore(backup)
    first = env.once()  # the rewind: lead-0..9 read back and confirmed
    assert "store is behind its target" in first.stderr
    env.accept(range(10, 25))  # the forgotten ten come again, and five new
    env.once()
    assert env.rows_per_key() == Counter({f"lead-{i}": 1 for i in range(25)})
    assert {r["state"] for r in env.records().values()} == {"confirmed"}
    later = "2026-12-31T00:00:00Z"  # past the window: sent without a look-up by key
    env.accept(range(25, 27))
    proc = env.once("--now", later)
    assert last_json(proc.stdout)["dispatched"] == 2 and last_json(proc.stdout)["requeued"] == 0
