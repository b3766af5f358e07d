"""Batch marks on the PostgreSQL table target (issue 30), against the real server: the
kit proves them; the mark lives in a side table of the documented columns, made with the
table, or on first use for a table made before marks; a refused batch applies nothing and
leaves the session usable; a mark table of the wrong shape is refused before anything
changes; a role that may not make the mark table delivers without marks."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import asyncpg
import pytest

from runner.errors import TargetUnavailable
from runner.io.targets.pgtable.names import side_name
from runner.io.targets.pgtable.target import PgTableTarget
from runner.leads.marks import NO_MARK, BatchMark, ForeignMark, StaleMark, TargetMark, marks
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError
from runner.testing import Harness, check_adapter
from tests import pg

pytestmark = pytest.mark.timeout(120)

CREATE = """
CREATE TABLE {t} (
    write_id       text PRIMARY KEY,
    tenant         text NOT NULL,
    source         text NOT NULL,
    source_lead_id text NOT NULL,
    is_test        boolean NOT NULL,
    contact_alias  text,
    status         text NOT NULL DEFAULT 'new'
)"""


@pytest.fixture
def schema() -> Iterator[str]:
    pg.require()
    name = pg.new_schema()
    pg.execute(f'CREATE SCHEMA "{name}"')
    yield name
    pg.drop_later([name])


Make = Callable[..., PgTableTarget]


@pytest.fixture
def make(schema: str) -> Iterator[Make]:
    made: list[PgTableTarget] = []

    def factory(table: str = "leads", dsn: str | None = None, **kw: float) -> PgTableTarget:
        made.append(PgTableTarget(dsn or pg.dsn(), f"{schema}.{table}", **kw))
        return made[-1]

    yield factory
    for adapter in made:
        adapter.close()


def record(i: int | str) -> CRMRecord:
    return CRMRecord(tenant="tenant-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=True, contact_alias=f"alias-{i}")


def batch(*ids: int) -> list[tuple[CRMRecord, str]]:
    return [(record(i), f"w-{i}") for i in ids]


def written(schema: str, table: str = "leads") -> list[str]:
    return [str(w) for (w,) in pg.fetch(f'SELECT write_id FROM "{schema}"."{table}" '
                                        "ORDER BY write_id")]


def held(schema: str, table: str = "leads_runner_mark") -> list[tuple[object, ...]]:
    return pg.fetch(f'SELECT owner, seq FROM "{schema}"."{table}"')


def test_the_table_target_proves_its_marks(make: Make) -> None:
    make().prepare_writes(True)
    report = check_adapter(Harness(healthy=lambda: make(), batch_size=50, poll_limit=50))
    report.assert_passed(require_dedupe=True, require_marks=True)
    proof = [c for c in report.checks if c.name.startswith("marks:")]
    assert len(proof) == 8 and all(c.outcome == "passed" for c in proof), report.text()
    assert "\nmarks_batches proven: a store that forgot" in report.text()


def test_a_new_table_has_a_mark_table_of_the_documented_columns_and_a_key_index(
        make: Make, schema: str) -> None:
    target = make()
    target.prepare_writes(True)
    assert marks(target) is True
    columns = pg.fetch(
        "SELECT column_name, data_type, is_nullable, column_default FROM "
        "information_schema.columns WHERE table_schema = $1 AND "
        "table_name = 'leads_runner_mark' ORDER BY ordinal_position", schema)
    assert [c[:3] for c in columns] == [
        ("one", "boolean", "NO"), ("owner", "text", "YES"), ("seq", "bigint", "NO"),
        ("updated_at", "timestamp with time zone", "NO")]
    assert held(schema) == [(None, 0)]
    assert target.read_mark() == NO_MARK
    assert pg.fetch("SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND "
                    "indexname = 'leads_runner_by_key'", schema) == [(
        f"CREATE INDEX leads_runner_by_key ON {schema}.leads USING btree "
        "(tenant, source_lead_id)",)]
    # a seq of a late epoch (epoch << 32 | counter) is kept whole
    seq = (3_000_000 << 32) | 7
    target.write_batch(batch(1), mark=BatchMark("store-a", seq))
    assert held(schema) == [("store-a", seq)]
    assert make().read_mark() == TargetMark("store-a", seq)


def test_a_long_table_name_gets_a_side_table_name_within_the_limit(
        make: Make, schema: str) -> None:
    name = "l" * 60
    target = make(name)
    target.prepare_writes(True)
    side = side_name(name, "_runner_mark")
    assert len(side) == 63 and side.endswith("_runner_mark")
    assert side != side_name("l" * 59 + "m", "_runner_mark")
    target.write_batch(batch(1), mark=BatchMark("store-a", 5))
    assert held(schema, side) == [("store-a", 5)]


def test_a_refused_batch_applies_nothing_and_the_session_goes_on(
        make: Make, schema: str) -> None:
    target = make()
    target.prepare_writes(True)
    target.write_batch(batch(1), mark=BatchMark("store-a", 10))
    with pytest.raises(StaleMark) as stale:
        target.write_batch(batch(2), mark=BatchMark("store-a", 10))
    assert isinstance(stale.value, BeforeWriteError)
    assert stale.value.held == TargetMark("store-a", 10)
    with pytest.raises(ForeignMark) as foreign:
        target.write_batch(batch(3), mark=BatchMark("store-b", 99))
    assert foreign.value.held == TargetMark("store-a", 10)
    with pytest.raises(StaleMark):
        target.raise_mark(BatchMark("store-a", 9))
    assert written(schema) == ["w-1"] and held(schema) == [("store-a", 10)]
    # the same adapter, the same session: the next batch applies
    target.write_batch(batch(2), mark=BatchMark("store-a", 11))
    assert written(schema) == ["w-1", "w-2"] and held(schema) == [("store-a", 11)]
    # a repeat of a write_id in a newer batch still adds no row, and moves the mark
    target.write_batch(batch(2, 4), mark=BatchMark("store-a", 12))
    assert written(schema) == ["w-1", "w-2", "w-4"] and held(schema) == [("store-a", 12)]
    # a row-less fence taken over by an adopting store
    target.raise_mark(BatchMark("store-b", 1), replaces="store-a")
    assert target.read_mark() == TargetMark("store-b", 1)
    found = target.read_by_keys([("tenant-1", "lead-2"), ("tenant-1", "lead-9")])
    assert [(r.write_id, dict(r.fields)) for r in found] == [
        ("w-2", record(2).fields())]


def test_a_table_made_before_marks_gets_its_mark_table_on_first_use(
        make: Make, schema: str) -> None:
    # a table of the previous version: runner's table and identity, no mark table
    first = make()
    first.prepare_writes(True)
    first.write_batch(batch(1))
    first.close()
    pg.execute(f'DROP TABLE "{schema}".leads_runner_mark')
    # the checks before work of a store that delivered before make it
    target = make()
    target.prepare_writes(False)
    assert marks(target) is True and held(schema) == [(None, 0)]
    target.write_batch(batch(2), mark=BatchMark("store-a", 1))
    assert held(schema) == [("store-a", 1)]
    # dropped under a running adapter: read as no mark, made again by the next marked
    # write (the first is refused, having applied nothing, and says why)
    pg.execute(f'DROP TABLE "{schema}".leads_runner_mark')
    assert target.read_mark() == NO_MARK
    with pytest.raises(BeforeWriteError, match="leads_runner_mark"):
        target.write_batch(batch(3), mark=BatchMark("store-a", 2))
    target.write_batch(batch(3), mark=BatchMark("store-a", 2))
    assert held(schema) == [("store-a", 2)] and written(schema) == ["w-1", "w-2", "w-3"]
    # its row deleted: made again as no owner, then marked
    pg.execute(f'DELETE FROM "{schema}".leads_runner_mark')
    assert target.read_mark() == NO_MARK
    target.write_batch(batch(4), mark=BatchMark("store-b", 1))
    assert held(schema) == [("store-b", 1)]
    # an unmarked batch (a runner that does not mark) leaves the mark as it is
    target.write_batch(batch(5))
    assert held(schema) == [("store-b", 1)]


def test_a_mark_table_of_the_wrong_shape_is_refused_before_anything_changes(
        make: Make, schema: str) -> None:
    pg.execute(CREATE.format(t=f'"{schema}".leads')
               + f'; CREATE TABLE "{schema}".leads_runner_mark (owner text, seq integer)')
    target = make()
    with pytest.raises(TargetUnavailable) as raised:
        target.prepare_writes(True)
    assert ("column seq of its mark table leads_runner_mark is integer, not bigint"
            in raised.value.message)
    assert "no column one" in raised.value.message
    assert pg.fetch(f"SELECT obj_description('\"{schema}\".leads'::regclass)") == [(None,)]


def test_a_role_that_may_not_make_the_mark_table_delivers_without_marks(
        make: Make, schema: str) -> None:
    role = f"r_{uuid.uuid4().hex[:12]}"
    pg.execute(CREATE.format(t=f'"{schema}".leads') + f""";
        CREATE ROLE {role} LOGIN;
        GRANT USAGE ON SCHEMA "{schema}" TO {role};
        GRANT SELECT, INSERT ON "{schema}".leads TO {role}""")
    try:
        # its owner adopts it (writing the identity); runner's role then checks it
        make().prepare_writes(True)
        pg.execute(f'DROP TABLE "{schema}".leads_runner_mark')
        user_dsn = pg.dsn().replace("//" + pg.dsn().split("//", 1)[1].split("@", 1)[0],
                                    f"//{role}", 1)
        target = make(dsn=user_dsn)
        target.prepare_writes(False)
        assert marks(target) is False
        target.write_batch(batch(1))
        assert written(schema) == ["w-1"]
        target.close()
    finally:
        pg.execute(f'DROP OWNED BY {role}; DROP ROLE {role}')


def test_concurrent_marked_writers_wait_for_each_other_on_the_mark(
        make: Make, schema: str) -> None:
    make().prepare_writes(True)
    one, two = make(), make()
    one.write_batch(batch(0), mark=BatchMark("s", 1))
    two.read_mark()  # sessions open
    # a transaction of someone else holds the mark's row: a marked batch waits for it
    # (the lock, not a check-then-write race), and applies when it is released
    release = threading.Event()
    locked = threading.Event()

    def hold() -> None:
        async def go() -> None:
            conn = await asyncpg.connect(pg.dsn())
            try:
                async with conn.transaction():
                    await conn.execute(
                        f'SELECT * FROM "{schema}".leads_runner_mark FOR UPDATE')
                    locked.set()
                    await asyncio.to_thread(release.wait, 60)
            finally:
                await conn.close()

        asyncio.run(go())

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(30)
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            two.write_batch(batch(1), mark=BatchMark("s", 2))
        except BaseException as exc:
            errors.append(exc)
        done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    # it is waiting on the row lock (seen by the server), not done
    deadline = time.monotonic() + 30
    while not pg.fetch("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND query LIKE '%runner_mark%FOR UPDATE%'"):
        assert time.monotonic() < deadline and not done.is_set(), errors
        time.sleep(0.01)
    assert written(schema) == ["w-0"]
    release.set()
    assert done.wait(30) and not errors, errors
    holder.join(30)
    assert written(schema) == ["w-0", "w-1"] and held(schema) == [("s", 2)]
