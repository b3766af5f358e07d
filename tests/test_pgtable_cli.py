"""Delivering into a PostgreSQL table through the CLI (issue 29): ``--target
postgresql://… --target-table NAME`` on both store backends (a SQLite store delivering
into the server, and a PostgreSQL store beside its target in the same database), polls of
the table's status column, the pin, the one-line refusals and usage errors, and a DSN's
password never in any output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pg
from tests.helpers import (
    CliStore,
    event,
    last_json,
    run_cli,
    run_main,
    status_records,
    write_json,
)
from tests.pgcluster import free_port

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def target_schema() -> Iterator[str]:
    """A schema for the target table on the shared server (the store is elsewhere: a
    file, or a schema of its own in the same database)."""
    pg.require()
    name = pg.new_schema()
    pg.execute(f'CREATE SCHEMA "{name}"')
    yield name
    pg.drop_later([name])


@pytest.fixture
def into_table(cli_store: CliStore, target_schema: str) -> CliStore:
    """The CLI store, its --target the shared server's database (--target-table given
    per command)."""
    cli_store.target = pg.dsn()  # type: ignore[assignment]
    return cli_store


def table_rows(schema: str) -> list[tuple[object, ...]]:
    return pg.fetch(f'SELECT write_id, tenant, source, source_lead_id, is_test, '
                    f'contact_alias, status FROM "{schema}".leads ORDER BY source_lead_id')


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_leads_are_delivered_into_a_table_and_polled_on_both_store_backends(
        into_table: CliStore, target_schema: str, workdir: Path) -> None:
    table = ("--target-table", f"{target_schema}.leads")
    into_table.accept(1, 2, 3)
    no_alias = event(4)
    del no_alias["contact_alias"]
    into_table.run("accept", "--record", write_json(workdir / "e4.json", no_alias))
    summary = into_table.cli("once", *table)
    assert (summary["dispatched"], summary["confirmed"], summary["uncertain"]) == (4, 4, 0)
    records = into_table.records()
    assert table_rows(target_schema) == [
        (records[f"lead-{i}"]["write_id"], "tenant-synthetic-1", "meta", f"lead-{i}", True,
         f"alias-{i}" if i < 4 else None, "new") for i in (1, 2, 3, 4)]
    # a second run sends nothing again; a changed status is seen by a poll
    again = into_table.cli("once", *table)
    assert (again["dispatched"], again["uncertain"]) == (0, 0)
    assert len(table_rows(target_schema)) == 4
    pg.execute(f"UPDATE \"{target_schema}\".leads SET status = 'qualified' "
               "WHERE source_lead_id = 'lead-2'")
    polled = into_table.cli("poll-status", *table)
    assert (polled["changed"], polled["unchanged"], polled["failed"]) == (1, 3, 0)
    assert into_table.records()["lead-2"]["snapshot"] == {"status": "qualified"}


@pytest.fixture
def pg_store(workdir: Path, scope_file: Path) -> Iterator[CliStore]:
    """A PostgreSQL store (a migrated, empty one from the test process's pool)."""
    pg.require()
    schema = pg.pooled_schema()
    yield CliStore(workdir, scope_file, pg.location(schema))
    pg.drop_later([schema])  # it holds a target table now: not given back to the pool


def test_a_postgresql_store_delivers_beside_itself_but_never_into_its_own_tables(
        pg_store: CliStore) -> None:
    store_schema = pg.schema_of(pg_store.db)
    pg_store.target = pg_store.db  # type: ignore[assignment]  # the same DSN and ?schema=
    pg_store.accept(1, 2)
    before = pg.dump(pg_store.db)
    for table in ("leads", "outbox", f"{store_schema}.meta"):
        proc = pg_store.once("--target-table", table)
        assert proc.returncode == 74, proc.stderr
        assert "one of runner's own store tables" in one_line(proc.stderr)
    assert pg.dump(pg_store.db) == before
    summary = pg_store.cli("once", "--target-table", "delivered_leads")
    assert summary["confirmed"] == 2
    assert pg.fetch(f'SELECT count(*) FROM "{store_schema}".delivered_leads') == [(2,)]


@pytest.mark.parametrize(("command", "args", "says"), [
    ("once", ["--target", "{dsn}"], "needs --target-table NAME"),
    ("start", ["--target", "{dsn}", "--cycles", "1"], "needs --target-table NAME"),
    ("poll-status", ["--target", "{dsn}"], "needs --target-table NAME"),
    ("once", ["--target", "{dir}/sheet.db", "--target-table", "leads"],
     "--target-table is for a postgresql:// --target"),
    ("once", ["--target", "http://127.0.0.1:9/sheet", "--target-table", "leads"],
     "--target-table is for a postgresql:// --target"),
    ("accept", ["--target-table", "leads", "--record", "{dir}/e1.json"],
     "--target-table is for a postgresql:// --target"),
    ("status", ["--target-table", "leads"], "--target-table is for a postgresql://"),
    ("once", ["--target", "{dsn}", "--target-table", "Leads"], "plain lower-case SQL name"),
    ("once", ["--target", "{dsn}", "--target-table", "a.b.c"], "plain lower-case SQL name"),
    ("once", ["--target", "{dsn}", "--target-table", "x;drop table y"],
     "plain lower-case SQL name"),
    ("once", ["--target", "{dsn}?schema=crm", "--target-table", "sales.leads"],
     "give one of them"),
    ("once", ["--target", "{dsn}", "--target-table", "leads", "--target-adapter",
              "tests.procs.example_adapter:make"], "not for a --target-adapter"),
    ("once", ["--target", "{dsn}", "--target-table", "leads", "--target-token-file",
              "{dir}/token"], "the PostgreSQL table target takes no --target-token-file"),
    ("once", ["--target", "{dsn}", "--target-table", "leads", "--target-option", "a=b"],
     "the PostgreSQL table target takes no --target-option a"),
    ("once", ["--target", "{dir}/sheet.db", "--target-timeout", "5"],
     "--target-timeout for those and a postgresql:// --target"),
])
def test_the_table_option_without_a_postgresql_target_or_the_reverse_is_a_usage_error(
        workdir: Path, scope_file: Path, target_schema: str, command: str,
        args: list[str], says: str) -> None:
    write_json(workdir / "e1.json", {})
    (workdir / "token").write_text("t0ken")
    db = workdir / "queue.db"
    given = [a.format(dsn=pg.dsn(), dir=workdir) for a in args]
    scope = [] if command == "status" else ["--scope", str(scope_file)]
    run = run_cli if command == "start" else run_main
    proc = run(command, "--db", db, *scope, *given)
    assert proc.returncode == 2, proc.stderr
    assert says in one_line(proc.stderr)
    assert not db.exists()
    assert not (workdir / "sheet.db").exists()
    assert pg.fetch("SELECT count(*) FROM pg_class WHERE relname = 'leads' AND "
                    "relnamespace = $1::regnamespace", f'"{target_schema}"') == [(0,)]


def test_a_table_of_the_wrong_shape_stops_the_run_before_any_record_is_in_flight(
        into_table: CliStore, target_schema: str) -> None:
    pg.execute(f'CREATE TABLE "{target_schema}".leads (write_id text, tenant text)')
    into_table.accept(1, 2)
    proc = into_table.once("--target-table", f"{target_schema}.leads")
    assert proc.returncode == 74, proc.stderr
    line = one_line(proc.stderr)
    assert f"table {target_schema}.leads at " in line and "is not a target table" in line
    assert "no column source, source_lead_id, is_test, contact_alias, status" in line
    assert "no unique key on write_id" in line
    assert {r["state"] for r in into_table.all_records()} == {"prepared"}
    assert pg.fetch(f'SELECT count(*) FROM "{target_schema}".leads') == [(0,)]
    assert pg.fetch(f"SELECT obj_description('\"{target_schema}\".leads'::regclass)") \
        == [(None,)]


def test_a_store_pinned_to_a_table_refuses_the_table_made_again(
        into_table: CliStore, target_schema: str) -> None:
    table = ("--target-table", f"{target_schema}.leads")
    into_table.accept(1)
    assert into_table.cli("once", *table)["confirmed"] == 1
    pg.execute(f'DROP TABLE "{target_schema}".leads')
    into_table.accept(2)
    proc = into_table.once(*table)
    assert proc.returncode == 78, proc.stderr
    assert "pinned to target" in one_line(proc.stderr)
    assert into_table.records()["lead-2"]["state"] == "prepared"
    assert pg.fetch("SELECT to_regclass($1)", f'"{target_schema}".leads') == [(None,)]
    # a poll of a store whose table is gone fails its reads, it says nothing is missing
    polled = run_main("poll-status", "--db", into_table.db, "--scope", into_table.scope,
                      "--target", pg.dsn(), *table)
    assert last_json(polled.stdout)["missing"] == 0


def test_an_unreachable_server_stops_the_run_with_every_record_still_prepared(
        cli_store: CliStore) -> None:
    cli_store.target = f"postgresql://root@127.0.0.1:{free_port()}/test"  # type: ignore
    cli_store.accept(1)
    proc = cli_store.once("--target-table", "leads")
    assert proc.returncode == 74, proc.stderr
    assert "connection refused" in one_line(proc.stderr)
    assert cli_store.records()["lead-1"]["state"] == "prepared"


def test_a_dsns_password_never_reaches_the_output_or_the_logs(
        workdir: Path, scope_file: Path, target_schema: str) -> None:
    secret = pg.dsn().replace("//root@", "//root:s3cret-pw@")
    db = workdir / "queue.db"
    store = CliStore(workdir, scope_file, db)
    store.accept(1)
    table = ("--target-table", f"{target_schema}.leads")
    started = run_cli("start", "--db", db, "--scope", scope_file, "--target", secret,
                      *table, "--cycles", "1", "--log-format", "json")
    assert started.returncode == 0, started.stderr
    banner = [json.loads(line) for line in started.stderr.splitlines()
              if '"runner.started"' in line]
    assert banner[0]["target"] == f"table {target_schema}.leads at 127.0.0.1:5432/test"
    refused = run_main("once", "--db", db, "--scope", scope_file, "--target", secret,
                       "--target-table", f"{target_schema}.other")
    assert refused.returncode == 78  # not the pinned table
    unreachable = run_main("once", "--db", db, "--scope", scope_file, "--target",
                           secret.replace(":5432/", f":{free_port()}/"), *table)
    assert unreachable.returncode == 74
    shown = run_main("config", "show", "--", "once", "--db", secret, "--scope", scope_file,
                     "--target", secret, *table)
    assert shown.returncode == 0, shown.stderr
    values = json.loads(shown.stdout)["values"]
    assert values["target"]["value"] == pg.dsn().replace("//root@", "//root:***@")
    assert values["target-table"]["value"] == f"{target_schema}.leads"
    for proc in (started, refused, unreachable, shown):
        assert "s3cret" not in proc.stdout + proc.stderr
    assert status_records(db)[0]["state"] == "confirmed"


def test_the_table_options_can_come_from_the_configuration_file(
        into_table: CliStore, target_schema: str, workdir: Path) -> None:
    flat, grouped = workdir / "flat.toml", workdir / "grouped.toml"
    flat.write_text(f'target = "{pg.dsn()}"\ntarget-table = "{target_schema}.leads"\n')
    grouped.write_text(f'[target]\nlocation = "{pg.dsn()}"\ntable = "{target_schema}.leads"\n'
                       "timeout = 20\n")
    for i, config in enumerate((flat, grouped), 1):
        into_table.accept(i)
        proc = run_main("once", "--db", into_table.db, "--scope", into_table.scope,
                        "--config", config)
        assert proc.returncode == 0, proc.stderr
        assert last_json(proc.stdout)["confirmed"] == 1
    assert len(table_rows(target_schema)) == 2


def test_runners_faults_wrap_the_table_target_and_a_lost_answer_is_reconciled(
        into_table: CliStore, target_schema: str) -> None:
    table = ("--target-table", f"{target_schema}.leads")
    into_table.accept(1, 2)
    now_due = ("--retry-base", "0", "--retry-cap", "0")  # sent again by the next run
    assert into_table.cli("once", *table, "--fault", "outage", *now_due)["failed_safe"] == 2
    assert pg.fetch(f'SELECT count(*) FROM "{target_schema}".leads') == [(0,)]
    summary = into_table.cli("once", *table, "--fault", "timeout")
    assert summary["uncertain"] == 2  # written, then the call failed
    again = into_table.cli("once", *table)
    assert (again["reconciled"], again["dispatched"]) == (2, 0)
    assert {r["state"] for r in into_table.all_records()} == {"confirmed"}
    assert pg.fetch(f'SELECT count(*) FROM "{target_schema}".leads') == [(2,)]
