"""The PostgreSQL table target against the real server (issue 29): it passes the
conformance kit with every condition a PostgreSQL server can be put in here, reads
exactly, deduplicates by write_id, creates or adopts its table only on the write path,
and refuses a table of the wrong shape (or one of runner's own) before anything is sent,
changing nothing.  Each test works in a schema of its own on the shared server; a server
that stops or restarts is a private cluster (tests/test_pgtable_restart.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.errors import TargetAbsent, TargetUnavailable
from runner.io.targets.pgtable.target import PgTableTarget, _answered
from runner.leads.marks import BatchMark
from runner.leads.models import CRMRecord
from runner.leads.port import (
    BeforeWriteError,
    Missing,
    Snapshot,
    TargetReadError,
    TargetRow,
    classify_readback,
)
from runner.testing import Condition, Harness, check_adapter
from tests import pg
from tests.helpers import ROOT, SCOPE, event
from tests.pgcluster import free_port
from tests.pgproxy import PgProxy

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
    """A schema of its own on the shared server (dropped when the test process ends)."""
    pg.require()
    name = pg.new_schema()
    pg.execute(f'CREATE SCHEMA "{name}"')
    yield name
    pg.drop_later([name])


Make = Callable[..., PgTableTarget]


@pytest.fixture
def make(schema: str) -> Iterator[Make]:
    """Adapters for tables of the test's schema, closed afterwards."""
    made: list[PgTableTarget] = []

    def factory(table: str = "leads", dsn: str | None = None, **kw: float) -> PgTableTarget:
        made.append(PgTableTarget(dsn or pg.dsn(), f"{schema}.{table}", **kw))
        return made[-1]

    yield factory
    for adapter in made:
        adapter.close()


def record(i: int | str, *, alias: str | None = "alias", is_test: bool = True) -> CRMRecord:
    return CRMRecord(tenant="tenant-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=is_test, contact_alias=None if alias is None else f"{alias}-{i}")


def rows(schema: str, table: str = "leads") -> list[tuple[object, ...]]:
    return pg.fetch(f'SELECT write_id, source_lead_id FROM "{schema}"."{table}" '
                    "ORDER BY write_id")


def catalog(schema: str) -> list[tuple[object, ...]]:
    """What DDL would change in the schema: tables, columns, indexes, comments."""
    return pg.fetch(
        "SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class'), "
        "  (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || "
        "   ' ' || a.attnotnull, ', ' ORDER BY a.attnum) FROM pg_attribute a "
        "   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), "
        "  c.xmin::text "
        "FROM pg_class c WHERE c.relnamespace = $1::regnamespace ORDER BY c.relname",
        f'"{schema}"')


def test_the_table_target_conforms_and_proves_it_deduplicates_in_every_condition_it_can_meet(
        make: Make, schema: str) -> None:
    make().prepare_writes(True)
    # a table that refuses the kit's records (a CHECK constraint): the server's ERROR
    pg.execute(CREATE.format(t=f'"{schema}".refusing')
               + f"; ALTER TABLE \"{schema}\".refusing ADD CONSTRAINT no_kit CHECK "
                 "(tenant <> 'tenant-conformance')")
    # a table whose insert ends its own session mid-statement: a FATAL, as a server that
    # fails in a way no client can tell from a failure after applying
    pg.execute(CREATE.format(t=f'"{schema}".dying') + f""";
        CREATE FUNCTION "{schema}".die() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);
        RETURN NULL; END $$;
        CREATE TRIGGER die BEFORE INSERT ON "{schema}".dying
        FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".die()""")
    port = int(pg.dsn().rsplit(":", 1)[1].split("/")[0])
    user = pg.dsn().split("//", 1)[1].split("@", 1)[0]

    def through(mode: str, timeout: float = 10.0) -> Callable[[], object]:
        @contextmanager
        def opened() -> Iterator[PgTableTarget]:
            # the batch statement: an INSERT in a WITH, answering with the batch's rows
            with PgProxy(port, mode,  # type: ignore[arg-type]
                         statement=b"INSERT INTO") as proxy:
                adapter = make(dsn=proxy.dsn(user, "test"), timeout=timeout)
                yield adapter
                adapter.close()
        return opened

    closed = f"postgresql://{user}@127.0.0.1:{free_port()}/test"
    report = check_adapter(Harness(
        healthy=lambda: make(),
        conditions={
            Condition.UNREACHABLE: lambda: make(dsn=closed),
            Condition.REJECTED: lambda: make("refusing"),
            Condition.SERVER_ERROR: lambda: make("dying"),
            Condition.APPLIED_THEN_LOST: through("drop"),
            Condition.TIMEOUT_AFTER_APPLY: through("hold", timeout=0.5),
        }))
    provoked = [c for c in Condition if c is not Condition.RATE_LIMITED]
    report.assert_passed(require=provoked)
    # a PostgreSQL server keeps no request quota: that condition alone is left out
    assert [c.name for c in report.skipped] == ["rate_limited: write"], report.text()
    # it declares that it deduplicates by write_id, and the kit's proof of it passes
    proof = [c for c in report.checks if c.name.startswith("dedupe:")]
    assert len(proof) >= 4 and all(c.outcome == "passed" for c in proof), report.text()
    # its write answers with the rows as stored, a held write_id's row as held
    assert {c.name: c.outcome for c in report.checks if c.name.startswith("answer:")} == {
        "answer: rows as stored": "passed", "answer: a held write_id's row": "passed"}


def test_a_new_table_has_the_documented_columns_and_an_identity_that_survives_reconnects(
        make: Make, schema: str) -> None:
    target = make()
    target.prepare_writes(True)
    columns = pg.fetch(
        "SELECT column_name, data_type, is_nullable, column_default FROM "
        "information_schema.columns WHERE table_schema = $1 AND table_name = 'leads' "
        "ORDER BY ordinal_position", schema)
    assert [c[:3] for c in columns] == [
        ("write_id", "text", "NO"), ("tenant", "text", "NO"), ("source", "text", "NO"),
        ("source_lead_id", "text", "NO"), ("is_test", "boolean", "NO"),
        ("contact_alias", "text", "YES"), ("status", "text", "NO"),
        ("created_at", "timestamp with time zone", "NO")]
    assert columns[6][3] == "'new'::text"
    assert pg.fetch("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                    "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE "
                    f"i.indrelid = '\"{schema}\".leads'::regclass AND i.indisprimary") \
        == [("write_id",)]
    first = target.target_id()
    assert len(first) == 32
    # another adapter, and the same adapter after the server ended its session
    assert make().target_id() == first
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
               "application_name LIKE $1", f"runner pid={os.getpid()} % target")
    assert target.target_id() == first
    # a read on a session the server ended a moment ago is made again on a new one
    for call in (lambda: target.read_back_many(["w-x"]), target.target_id,
                 lambda: target.prepare_writes(True)):
        pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                   "application_name LIKE $1", f"runner pid={os.getpid()} % target")
        call()
    target.prepare_writes(True)  # nothing to do: the same identity
    assert make().target_id() == first


def test_reads_are_exact_every_row_of_every_write_id_asked_with_its_types(
        make: Make) -> None:
    target = make()
    target.prepare_writes(True)
    items = [(record(1, alias=None, is_test=False), "w-1"), (record(2), "w-2")]
    target.write_batch(items)
    found = {r.write_id: r for r in make().read_back_many(["w-1", "w-2", "w-absent"])}
    assert set(found) == {"w-1", "w-2"}
    assert found["w-1"].fields == {"tenant": "tenant-1", "source": "meta",
                                   "source_lead_id": "lead-1", "is_test": False,
                                   "contact_alias": None}
    assert found["w-1"].fields["is_test"] is False
    assert type(found["w-2"].fields["is_test"]) is bool
    assert found["w-2"].fields["contact_alias"] == "alias-2"
    assert found["w-2"].status == "new"
    for r, w in items:
        assert classify_readback(target.read_back(w), r, w) == "match"
    # a thousand write_ids in one read (the default batch), all there
    many = [(record(f"m{i}"), f"m-{i}") for i in range(1000)]
    target.write_batch(many)
    assert len(target.read_back_many([w for _, w in many])) == 1000
    seen = target.observe_status(["w-1", "w-absent"])
    assert seen == {"w-1": Snapshot({"status": "new"}), "w-absent": Missing()}


def test_a_write_id_written_twice_makes_one_row_and_answers_as_the_first(
        make: Make, schema: str) -> None:
    target = make()
    target.prepare_writes(True)
    target.write_batch([(record(1), "w-1"), (record(1), "w-1")])  # twice in one batch
    target.write_batch([(record(1), "w-1"), (record(2), "w-2")])  # again, in another
    others = [make() for _ in range(4)]
    threads = [threading.Thread(target=o.write_batch, args=([(record(3), "w-3")],))
               for o in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert rows(schema) == [("w-1", "lead-1"), ("w-2", "lead-2"), ("w-3", "lead-3")]
    assert classify_readback(target.read_back("w-3"), record(3), "w-3") == "match"


def test_reads_and_the_identity_never_create_a_table(make: Make, schema: str) -> None:
    target = make()
    with pytest.raises(TargetAbsent, match="no table"):
        target.target_id()
    with pytest.raises(TargetReadError):
        target.read_back("w-1")
    with pytest.raises(TargetReadError):
        target.observe_status(["w-1"])
    with pytest.raises(TargetAbsent):
        target.prepare_writes(False)
    assert catalog(schema) == []
    with pytest.raises(TargetAbsent, match="create it first"):
        PgTableTarget(pg.dsn(), "no_such_schema_here.leads").prepare_writes(True)


def test_a_users_table_of_the_right_shape_is_adopted_keeping_its_rows_and_comment(
        make: Make, schema: str) -> None:
    pg.execute(CREATE.format(t=f'"{schema}".leads')
               + f""";COMMENT ON TABLE "{schema}".leads IS 'Our web leads.';
               INSERT INTO "{schema}".leads VALUES ('theirs', 't', 'meta', 'x', true, NULL,
               'won')""")
    target = make()
    with pytest.raises(TargetUnavailable, match="no runner identity yet"):
        target.target_id()  # a read adopts nothing
    with pytest.raises(TargetUnavailable, match="has delivered before"):
        target.prepare_writes(False)
    assert pg.fetch(f"SELECT obj_description('\"{schema}\".leads'::regclass)") == [
        ("Our web leads.",)]
    target.prepare_writes(True)
    comment = pg.fetch(f"SELECT obj_description('\"{schema}\".leads'::regclass)")[0][0]
    assert comment.startswith("Our web leads.\nrunner-target-id: ")
    assert make().target_id() == comment.split("runner-target-id: ")[1][:32]
    assert rows(schema) == [("theirs", "x")]


def test_a_table_dropped_and_made_again_has_another_identity(make: Make, schema: str) -> None:
    target = make()
    target.prepare_writes(True)
    first = target.target_id()
    pg.execute(f'DROP TABLE "{schema}".leads')
    second = make()
    second.prepare_writes(True)
    assert second.target_id() != first


WRONG = {
    "a missing column": ("ALTER TABLE {t} DROP COLUMN contact_alias",
                         "no column contact_alias"),
    "a mistyped column": ("ALTER TABLE {t} ALTER COLUMN is_test TYPE text",
                          "column is_test is text, not boolean"),
    "no key on write_id": ("ALTER TABLE {t} DROP CONSTRAINT {k}",
                           "no unique key on write_id"),
    "a partial unique index": ("ALTER TABLE {t} DROP CONSTRAINT {k}; CREATE UNIQUE INDEX "
                               "ON {t} (write_id) WHERE is_test",
                               "no unique key on write_id"),
    "a deferrable key": ("ALTER TABLE {t} DROP CONSTRAINT {k}; ALTER TABLE {t} ADD "
                         "UNIQUE (write_id) DEFERRABLE", "no unique key on write_id"),
    "a key on two columns": ("ALTER TABLE {t} DROP CONSTRAINT {k}; ALTER TABLE {t} ADD "
                             "PRIMARY KEY (write_id, tenant)", "no unique key on write_id"),
    "a required alias": ("ALTER TABLE {t} ALTER COLUMN contact_alias SET NOT NULL",
                         "contact_alias is NOT NULL"),
    "a nullable status": ("ALTER TABLE {t} ALTER COLUMN status DROP NOT NULL",
                          "status must be NOT NULL with a default"),
    "an extra required column": ("ALTER TABLE {t} ADD COLUMN owner text NOT NULL",
                                 "column owner is NOT NULL without a default"),
    "a view": ("ALTER TABLE {t} RENAME TO base; CREATE VIEW {t} AS SELECT * FROM {b}",
               "it is a view, not a table"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_table_of_the_wrong_shape_is_refused_before_anything_changes(
        make: Make, schema: str, case: str) -> None:
    t, b = f'"{schema}".leads', f'"{schema}".base'
    ddl, words = WRONG[case]
    pg.execute(CREATE.format(t=t) + "; " + ddl.format(t=t, b=b, k="leads_pkey"))
    before = catalog(schema)
    target = make()
    for call in (lambda: target.prepare_writes(True), target.target_id):
        with pytest.raises(TargetUnavailable) as raised:
            call()
        assert words in raised.value.message
        assert "\n" not in raised.value.message
        assert f"table {schema}.leads at " in raised.value.message
    assert catalog(schema) == before
    assert pg.fetch(f"SELECT count(*) FROM {t}") == [(0,)]


def test_one_of_runners_own_store_tables_is_refused_in_the_same_database() -> None:
    pg.require()
    store = pg.pooled_schema()  # a migrated store in the same database as the target
    try:
        before = pg.dump(pg.location(store))
        for table in ("leads", "meta", "outbox", "target_pin"):
            target = PgTableTarget(pg.location(store), table)  # by ?schema= of the DSN
            try:
                for call in (lambda t=target: t.prepare_writes(True), target.target_id):
                    with pytest.raises(TargetUnavailable,
                                       match="one of runner's own store tables"):
                        call()
            finally:
                target.close()
        assert pg.dump(pg.location(store)) == before
        # beside the store, in its schema, a table of another name is a target
        beside = PgTableTarget(pg.dsn(), f"{store}.delivered_leads")
        beside.prepare_writes(True)
        beside.close()
    finally:
        pg.drop_later([store])


def test_an_unreachable_server_is_not_sent_and_its_reads_fail(make: Make) -> None:
    target = make(dsn=f"postgresql://root@127.0.0.1:{free_port()}/test")
    with pytest.raises(BeforeWriteError, match="not sent: cannot reach"):
        target.write_batch([(record(1), "w-1")])
    with pytest.raises(TargetReadError):
        target.read_back_many(["w-1"])
    with pytest.raises(TargetUnavailable, match="cannot reach"):
        target.target_id()


def test_the_repr_and_every_message_name_the_table_never_the_password(schema: str) -> None:
    secret = pg.dsn().replace("//root@", "//root:s3cret-pw@")
    target = PgTableTarget(secret, f"{schema}.leads")
    try:
        assert "s3cret" not in repr(target)
        with pytest.raises(TargetAbsent) as raised:
            target.target_id()
        assert "s3cret" not in raised.value.message
    finally:
        target.close()


def test_without_asyncpg_the_table_target_is_one_clear_error(tmp_path: object) -> None:
    code = ("import sys; sys.modules['asyncpg'] = None\n"
            "from runner.io.targets.compose import TargetOptions, open_adapter\n"
            "from runner.errors import RunnerError\n"
            "try:\n"
            "    open_adapter(TargetOptions('postgresql://u@h/db', table='leads'))\n"
            "except RunnerError as exc:\n"
            "    print(exc.exit_code, exc.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.stdout.strip() == ("74 the PostgreSQL table target: PostgreSQL support is "
                                   "not installed: pip install 'runner[postgres]'"), proc.stderr


def test_a_batch_write_answers_with_its_rows_as_the_table_holds_them(
        make: Make, schema: str) -> None:
    """The batch statement's answer is the table's rows for the batch's write_ids once it
    committed: a row it made as stored (its defaults), a row held already as it is (not
    as sent), one per write_id however often the batch repeats it; marked or not."""
    target = make()
    target.prepare_writes(True)
    pg.execute(f'INSERT INTO "{schema}".leads (write_id, tenant, source, source_lead_id, '
               "is_test, contact_alias, status) VALUES ('w-1', 'tenant-1', 'meta', "
               "'lead-1', true, 'changed-1', 'won')")
    answer = target.write_batch([(record(1), "w-1"), (record(2), "w-2"),
                                 (record(2), "w-2")])
    assert answer is not None
    assert sorted((r.write_id, r.fields["contact_alias"], r.status) for r in answer) == [
        ("w-1", "changed-1", "won"), ("w-2", "alias-2", "new")]
    assert [classify_readback([r], record(i), f"w-{i}") for i, r in
            zip((1, 2), sorted(answer, key=lambda r: r.write_id), strict=True)] == [
        "mismatch", "match"]
    marked = target.write_batch([(record(3), "w-3"), (record(2), "w-2")],
                                mark=BatchMark("store-a", 1))
    assert marked is not None
    assert sorted((r.write_id, r.status) for r in marked) == [("w-2", "new"), ("w-3", "new")]
    assert rows(schema) == [("w-1", "lead-1"), ("w-2", "lead-2"), ("w-3", "lead-3")]


def test_an_answer_missing_a_write_id_of_the_batch_is_no_answer() -> None:
    """A row another session committed after the statement's snapshot is in neither half
    of the answer: the batch is then read back (None), never judged on part of it."""
    row = ("w-1", "tenant-1", "meta", "lead-1", True, "alias-1", "new")
    assert _answered([row], ["w-1", "w-2"]) is None
    answered = _answered([row], ["w-1", "w-1"])
    assert answered is not None and [r.write_id for r in answered] == ["w-1"]


class CountedReads(PgTableTarget):
    """The table target, counting its readbacks."""

    reads = 0

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        CountedReads.reads += 1
        return super().read_back_many(write_ids)


async def test_runner_confirms_a_batch_from_the_write_and_reads_nothing_back(
        schema: str, tmp_path: Path) -> None:
    target = CountedReads(pg.dsn(), f"{schema}.leads")
    CountedReads.reads = 0
    try:
        async with DurableWorker(str(tmp_path / "q.db"), SCOPE, target) as worker:
            for i in range(5):
                assert (await worker.accept(event(i))).ok
            summary = await worker.run_cycle(batch_size=2)
    finally:
        target.close()
    assert (summary.dispatched, summary.confirmed, summary.uncertain) == (5, 5, 0)
    assert CountedReads.reads == 0
    assert sorted(lead for _, lead in rows(schema)) == [f"lead-{i}" for i in range(5)]
