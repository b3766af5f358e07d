"""Issue 15 point 2: the target is pinned like the scope (SPEC L9).

The store records the identity of the target it delivers to; another target later is
refused (exit 78) and changes nothing.  Polls never create a target, and an absent,
foreign or other target is a failed read (poll health), never an explicit missing.
A store made before pinning pins the first target a delivery run gives it, with the
guards of ``runner.tasks.target``.  Users' own adapters keep working: without an identity
they are trusted, as before.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from runner import DurableWorker
from runner.errors import ConfigMismatch, LockHeld
from runner.io.postgres import schema as pg_schema
from runner.io.sqlite import schema as sqlite_schema
from runner.io.stores import open_store
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import Missing, Observation, Snapshot, TargetRow
from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import (
    SCOPE,
    cli,
    digest,
    dump_store,
    event,
    status_records,
    worker_records,
    write_json,
)


class Delivered:
    """A store whose three records were delivered to ``target.db`` (and polled once)."""

    def __init__(self, workdir: Path, scope_file: Path, db: str) -> None:
        self.dir, self.db, self.scope = workdir, db, scope_file
        self.target = workdir / "target.db"
        for i in range(3):
            record = write_json(workdir / f"e{i}.json", event(i))
            assert self.run("accept", "--record", record)[0] == 0
        code, out, err = self.run("once", "--target", self.target)
        assert code == 0 and json.loads(out)["confirmed"] == 3, err

    def run(self, command: str, *extra: str | Path) -> tuple[int, str, str]:
        return cli(command, "--db", self.db, "--scope", self.scope, *extra)

    def status(self) -> dict[str, Any]:
        code, out, err = cli("status", "--db", self.db)
        assert code == 0, err
        return json.loads(out)  # type: ignore[no-any-return]

    def states(self) -> list[str]:
        return [r["state"] for r in status_records(self.db)]

    def other_target(self) -> Path:
        """A real target of another store (with a row of its own)."""
        other = self.dir / "other.db"
        sheet = SyntheticTarget(str(other))
        sheet.write(CRMRecord(tenant="x", source="meta", source_lead_id="x-1", is_test=True,
                              contact_alias=None), "someone-else")
        sheet.close()
        return other


@pytest.fixture
def delivered(workdir: Path, scope_file: Path, db_location: str) -> Delivered:
    return Delivered(workdir, scope_file, db_location)


def pinned(db: str) -> str | None:
    async def read() -> str | None:
        async with await open_store(db) as store:
            return await store.pinned_target()
    return pg.run(read)


def test_the_first_delivery_pins_the_target(delivered: Delivered) -> None:
    sheet = SyntheticTarget(str(delivered.target))
    assert pinned(delivered.db) == sheet.target_id()
    sheet.close()


def test_a_typo_target_is_refused_and_never_created(delivered: Delivered) -> None:
    typo = delivered.dir / "targte.db"
    before = dump_store(delivered.db)
    for command in ("once", "start"):
        extra = ("--cycles", "1") if command == "start" else ()
        code, out, err = delivered.run(command, "--target", typo, *extra)
        assert code == 78, err
        assert out == "" and len(err.strip().splitlines()) == 1 and "pinned" in err
        assert not typo.exists()
        assert dump_store(delivered.db) == before


def test_another_target_is_refused_and_left_as_it_was(delivered: Delivered) -> None:
    other = delivered.other_target()
    before, store_before = digest(other), dump_store(delivered.db)
    code, out, err = delivered.run("once", "--target", other)
    assert code == 78 and out == "" and "pinned to target" in err
    assert digest(other) == before
    assert dump_store(delivered.db) == store_before


@pytest.mark.parametrize("kind", ["absent", "other", "foreign", "empty"])
def test_a_poll_of_a_target_that_is_not_the_pinned_one_fails_and_never_deletes(
    delivered: Delivered, kind: str
) -> None:
    if kind == "absent":
        target = delivered.dir / "targte.db"
    elif kind == "other":
        target = delivered.other_target()
    else:
        target = delivered.dir / f"{kind}.db"
        target.touch(mode=0o600)
        if kind == "foreign":
            conn = sqlite3.connect(target)
            conn.execute("CREATE TABLE notes (body TEXT)")
            conn.commit()
            conn.close()
    before = digest(target) if target.exists() else None
    code, out, err = delivered.run("poll-status", "--target", target)
    assert code == 74, err  # every read of the pass failed (issue 19)
    assert json.loads(out) == {"polled": 3, "changed": 0, "unchanged": 0, "missing": 0,
                               "failed": 3}
    assert (digest(target) if target.exists() else None) == before  # never created
    doc = delivered.status()
    assert delivered.states() == ["confirmed"] * 3
    assert doc["poll_health"][0]["open"] and doc["poll_health"][0]["failure"].startswith(
        "target_")
    # the pinned target still answers, and an explicit missing from it still counts
    conn = sqlite3.connect(delivered.target)
    conn.execute("DELETE FROM sheet WHERE source_lead_id = 'lead-1'")
    conn.commit()
    conn.close()
    code, out, err = delivered.run("poll-status", "--target", delivered.target)
    assert code == 0 and json.loads(out)["missing"] == 1, err
    assert sorted(delivered.states()) == ["confirmed", "confirmed", "confirmed_then_missing"]


# -- a store (and a target) made before pinning ----------------------------------------


def make_pre_pinning(db: str, target: Path) -> None:
    """Make a current store one that never pinned a target, as a store made before
    pinning (v5) is once migrated: its ``target_pin`` table empty (recreated from the v6
    migration's own text, whatever later migrations did); and its target one made before
    identities (no ``target_meta``)."""
    if pg.is_pg(db):
        from runner.io.postgres import schema as pg_schema

        s = f'"{pg.schema_of(db)}"'
        pg.execute(f"DROP TABLE {s}.target_pin; DROP FUNCTION {s}.target_pin_fixed();"
                   + pg_schema.render(pg_schema.V6, s))
    else:
        from runner.io.sqlite import schema as sqlite_schema

        conn = sqlite3.connect(db)
        conn.executescript("DROP TABLE target_pin;" + sqlite_schema.V6)
        conn.close()
    conn = sqlite3.connect(target)
    conn.executescript("DROP TABLE target_meta;")
    conn.close()


def test_a_store_made_before_pinning_adopts_only_the_target_it_delivered_to(
    delivered: Delivered,
) -> None:
    make_pre_pinning(delivered.db, delivered.target)
    # a poll before the store is pinned: no missing believed, nothing created
    typo = delivered.dir / "targte.db"
    code, out, err = delivered.run("poll-status", "--target", typo)
    assert code == 74 and json.loads(out)["missing"] == 0, err  # every read failed
    assert not typo.exists()
    # a delivery run with a typo: never created for a store that has delivered
    code, _, err = delivered.run("once", "--target", typo)
    assert code == 74 and not typo.exists(), err
    # another store's target holds none of this store's records: refused, untouched
    other = delivered.other_target()
    before = digest(other)
    code, _, err = delivered.run("once", "--target", other)
    assert code == 78 and "none of this store's confirmed records" in err, err
    assert digest(other) == before
    assert pinned(delivered.db) is None
    # its own target: pinned (and given an identity)
    code, out, err = delivered.run("once", "--target", delivered.target)
    assert code == 0, err
    sheet = SyntheticTarget(str(delivered.target))
    assert pinned(delivered.db) == sheet.target_id()
    sheet.close()
    assert delivered.states() == ["confirmed"] * 3
    assert len(sheet_rows(delivered.target)) == 3


def test_the_pin_is_in_a_migration_of_its_own_and_never_changes(db_location: str) -> None:
    assert sqlite_schema.LATEST == pg_schema.LATEST >= 6
    assert "target_pin" in sqlite_schema.MIGRATIONS[6]
    assert "target_pin" in pg_schema.MIGRATIONS[6]

    async def go() -> None:
        from datetime import UTC, datetime

        now = datetime(2026, 1, 1, tzinfo=UTC)
        async with await open_store(db_location) as store:
            assert await store.pinned_target() is None
            assert await store.pin_target("first", now) == "first"
            assert await store.pin_target("second", now) == "first"
            assert await store.pinned_target() == "first"
    pg.run(go)
    if pg.is_pg(db_location):
        with pytest.raises(Exception, match="never changes"):
            pg.execute(f'UPDATE "{pg.schema_of(db_location)}".target_pin SET target_id = $1',
                       "second")
    else:
        conn = sqlite3.connect(db_location)
        with pytest.raises(sqlite3.DatabaseError, match="never changes"):
            conn.execute("UPDATE target_pin SET target_id = 'second'")
        conn.close()


# -- users' own adapters ---------------------------------------------------------------


class MemoryCRM:
    """A user's adapter as written before pinning existed: the three port methods."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.rows[write_id] = record.model_dump()

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        row = self.rows.get(write_id)
        return [TargetRow(write_id, row)] if row is not None else []

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        return {w: Snapshot({"status": "new"}) if w in self.rows else Missing()
                for w in write_ids}


class NamedCRM(MemoryCRM):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def target_id(self) -> str:
        return self.name


async def test_a_user_adapter_without_identity_keeps_working(db_location: str) -> None:
    crm = MemoryCRM()
    async with DurableWorker(db_location, SCOPE, crm) as worker:
        for i in range(2):
            await worker.accept(event(i))
        assert (await worker.run_cycle()).confirmed == 2
        crm.rows.pop(next(iter(crm.rows)))  # trusted as before: its missing counts
        assert (await worker.poll()).missing == 1
        assert await worker.store.pinned_target() is None


async def test_a_user_adapter_with_identity_is_pinned(db_location: str) -> None:
    first = NamedCRM("crm-a")
    async with DurableWorker(db_location, SCOPE, first) as worker:
        await worker.accept(event(1))
        assert (await worker.run_cycle()).confirmed == 1
        assert await worker.store.pinned_target() == "crm-a"
    second = NamedCRM("crm-b")
    async with DurableWorker(db_location, SCOPE, second) as worker:
        await worker.accept(event(2))
        before = await worker_records(worker)
        with pytest.raises(ConfigMismatch) as refused:  # exit 78, like the scope
            await worker.run_cycle()
        assert refused.value.reason == "target_mismatch"
        assert (await worker.poll()).failed == 1  # not a missing: a failed read
        after = await worker_records(worker)
    assert second.rows == {}
    assert [r["state"] for r in after] == [r["state"] for r in before]


def test_two_workers_pinning_at_once_end_with_one_pin(db_location: str) -> None:
    async def deliver(name: str) -> str | None:
        async with DurableWorker(db_location, SCOPE, NamedCRM(name)) as worker:
            try:
                await worker.run_cycle()
            except (ConfigMismatch, LockHeld):  # the lock comes first, then the pin
                return None
            return name

    async def both() -> list[str | None]:
        results: list[str | None] = []

        async def one(name: str) -> None:
            results.append(await deliver(name))
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "crm-a")
            tg.start_soon(one, "crm-b")
        return results

    results = pg.run(both)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and pinned(db_location) == winners[0]


class CountingCRM(NamedCRM):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.asked = 0

    def target_id(self) -> str:
        self.asked += 1
        return self.name


async def test_the_checks_run_once_per_open_worker(db_location: str) -> None:
    crm = CountingCRM("crm-a")
    async with DurableWorker(db_location, SCOPE, crm) as worker:
        for i in range(3):
            await worker.accept(event(i))
            await worker.run_cycle()
            await worker.poll()
    assert crm.asked == 1 and len(crm.rows) == 3
