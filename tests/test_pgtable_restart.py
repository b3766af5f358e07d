"""The PostgreSQL table target when its server goes away (issue 29): a private cluster
(tests/pgcluster.py; the shared server is never stopped) stopped fast, stopped
immediately or its postmaster killed with SIGKILL — between batches, in the middle of a
batch's INSERT, and after the server committed a batch but before runner heard — then
started again.  Nothing is lost, nothing is written twice: what runner could not know is
uncertain until a readback settles it, confirmed when the row is there, sent again by
runner itself when it is not (the target deduplicates by write_id, SPEC E7).  Also
here, as roles belong to a whole cluster: the grants the docs give a role are enough, and
fewer are refused before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner.errors import TargetUnavailable
from runner.io.targets.pgtable.target import PgTableTarget
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, TargetReadError, classify_readback
from tests.helpers import Child, CliStore, run_main
from tests.pgcluster import Cluster, private_cluster, sessions, wait_until
from tests.pgproxy import PgProxy

pytestmark = pytest.mark.timeout(180)

N = 40
SLOW_INSERT = """
CREATE FUNCTION {s}.slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(120); RETURN NULL; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON {s}.leads
FOR EACH STATEMENT EXECUTE FUNCTION {s}.slow_insert();
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with private_cluster() as made:
        yield made


@pytest.fixture
def up(cluster: Cluster) -> Cluster:
    """The module's cluster, running (a test before may have left it stopped)."""
    if not cluster.is_running():
        cluster.start()
    return cluster


_schemas = iter(range(1, 10**6))


@pytest.fixture
def schema(up: Cluster) -> str:
    name = f"s{next(_schemas)}"
    up.execute(f"CREATE SCHEMA {name}")
    return name


def record(i: int) -> CRMRecord:
    return CRMRecord(tenant="tenant-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=True, contact_alias=f"alias-{i}")


def test_a_restart_or_a_kill_between_batches_costs_no_record(up: Cluster,
                                                             schema: str) -> None:
    target = PgTableTarget(up.dsn(), f"{schema}.leads", timeout=5)
    try:
        target.prepare_writes(True)
        first = target.target_id()
        target.write_batch([(record(1), "w-1")])
        for stop in ("fast", "immediate", "kill9"):
            if stop == "kill9":
                up.kill9()
            else:
                up.stop(stop)  # type: ignore[arg-type]
            # down: nothing can be sent, and no read says anything
            with pytest.raises(BeforeWriteError, match="not sent"):
                target.write_batch([(record(2), "w-2")])
            with pytest.raises(TargetReadError):
                target.read_back("w-1")
            with pytest.raises(TargetUnavailable):
                target.target_id()
            up.start()
            # up again: the session is made anew, the identity is the table's
            target.write_batch([(record(2), "w-2")])
            assert target.target_id() == first
        assert [classify_readback(target.read_back(w), record(i), w)
                for i, w in ((1, "w-1"), (2, "w-2"))] == ["match", "match"]
        assert up.fetch(f"SELECT count(*) FROM {schema}.leads") == [(2,)]
    finally:
        target.close()


def _store(workdir: Path, scope_file: Path, n: int, target: str) -> CliStore:
    """A SQLite store with ``n`` accepted leads, its ``--target`` the cluster."""
    store = CliStore(workdir, scope_file, workdir / "queue.db")
    store.target = target  # type: ignore[assignment]
    store.accept(*range(1, n + 1))
    return store


def _uncertain(store: CliStore) -> list[dict[str, object]]:
    proc = run_main("uncertain", "--db", store.db)
    assert proc.returncode == 0, proc.stderr
    found: list[dict[str, object]] = json.loads(proc.stdout)["records"]
    return found


def _settled(store: CliStore, cluster: Cluster, schema: str, table: tuple[str, ...]) -> None:
    """After the server is back: the batch's records had no row, and the target
    deduplicates by write_id, so runner itself sends them again (SPEC E7): the next run
    reads them back ("no row"), queues them to be sent again (due at once here) and sends
    them; then every record is confirmed with exactly one row."""
    again = store.cli("once", *table, "--retry-base", "0", "--retry-cap", "0")
    assert (again["recovered"], again["requeued"], again["confirmed"]) == (0, N, N), again
    _held_once(store, cluster, schema)


def _held_once(store: CliStore, cluster: Cluster, schema: str) -> None:
    """Every record confirmed, with exactly one row."""
    assert {r["state"] for r in store.all_records()} == {"confirmed"}
    held = cluster.fetch(f"SELECT write_id, count(*) FROM {schema}.leads GROUP BY 1")
    assert sorted(w for w, _ in held) == sorted(r["write_id"] for r in store.all_records())
    assert {count for _, count in held} == {1}


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["fast", "immediate", "kill9"])
def test_a_server_that_goes_down_in_the_middle_of_a_batch_loses_and_duplicates_nothing(
        up: Cluster, schema: str, workdir: Path, scope_file: Path, stop: str) -> None:
    table = ("--target-table", f"{schema}.leads")
    store = _store(workdir, scope_file, N, up.dsn())
    prepared = PgTableTarget(up.dsn(), f"{schema}.leads")
    prepared.prepare_writes(True)
    prepared.close()
    up.execute(SLOW_INSERT.format(s=schema))
    child = Child("once", "--db", store.db, "--scope", scope_file, "--target", up.dsn(),
                  *table, "--target-timeout", "300", "--log-format", "json")
    try:
        child.wait_err('"batch.in_flight"')
        # the batch's INSERT is running (in its trigger): the server goes down now
        wait_until(lambda: sessions(up, "wait_event = 'PgSleep'"), 60,
                   "the batch's INSERT to run")
        if stop == "kill9":
            up.kill9()
        else:
            up.stop(stop)  # type: ignore[arg-type]
        assert child.finish(60) == 0, child.err
    finally:
        child.kill()
    summary = json.loads(child.out[-1])
    # a marked batch is one transaction with its mark (SPEC E8): a session lost before
    # its COMMIT applied nothing, so the batch is "not sent" (failed_safe), not uncertain
    assert (summary["dispatched"], summary["failed_safe"], summary["uncertain"],
            summary["confirmed"]) == (N, N, 0, 0)
    records = store.all_records()
    assert {r["state"] for r in records} == {"failed_safe"}
    assert {r["last_failure"] for r in records} == {"not_sent"}  # for the operator
    assert all("before its commit" in str(r["last_error"]) for r in records)
    if stop == "fast":
        assert all("administrator command" in str(r["last_error"]) for r in records)
    up.start()
    up.execute(f"DROP TRIGGER slow_insert ON {schema}.leads")
    # the transaction was rolled back with the session: no row of the batch exists
    assert up.fetch(f"SELECT count(*) FROM {schema}.leads") == [(0,)]
    due = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    again = store.cli("once", *table, "--now", due)  # past the retry's backoff
    assert (again["recovered"], again["requeued"], again["confirmed"]) == (0, 0, N), again
    _held_once(store, up, schema)


@pytest.mark.slow
def test_a_server_that_goes_down_after_committing_a_batch_is_confirmed_by_readback(
        up: Cluster, schema: str, workdir: Path, scope_file: Path) -> None:
    table = ("--target-table", f"{schema}.leads")
    store = _store(workdir, scope_file, N, up.dsn())
    prepared = PgTableTarget(up.dsn(), f"{schema}.leads")  # the table and its mark table
    prepared.prepare_writes(True)
    prepared.close()
    # through the proxy the run's check of the mark table commits first, then the start's
    # fence, then the batch (its rows and its mark): the third COMMIT is held
    with PgProxy(up.port, "hold", on=b"COMMIT", skip=2) as proxy:
        child = Child("once", "--db", store.db, "--scope", scope_file, "--target",
                      proxy.dsn(up.superuser, "postgres"), *table, "--target-timeout",
                      "300", "--log-format", "json")
        try:
            assert proxy.committed.wait(60), child.err
            # committed, the answer not yet with runner: the server goes down now
            up.stop("fast")
            proxy.release.set()
            assert child.finish(60) == 0, child.err
        finally:
            child.kill()
    summary = json.loads(child.out[-1])
    assert (summary["uncertain"], summary["confirmed"]) == (N, 0)
    up.start()
    assert up.fetch(f"SELECT count(*) FROM {schema}.leads") == [(N,)]
    again = store.cli("once", *table)
    assert (again["reconciled"], again["dispatched"]) == (N, 0)
    assert {r["state"] for r in store.all_records()} == {"confirmed"}
    held = up.fetch(f"SELECT write_id FROM {schema}.leads")
    assert sorted(w for (w,) in held) == sorted(r["write_id"] for r in store.all_records())


GRANTS = """
CREATE ROLE {owner};
CREATE ROLE {writer} LOGIN;
CREATE SCHEMA {s} AUTHORIZATION {owner};
GRANT USAGE ON SCHEMA {s} TO {writer};
"""


def _sql_after(text: str, marker: str) -> str:
    """The SQL block that follows ``<!-- marker -->`` on a docs page."""
    return text.split(f"<!-- {marker} -->")[1].split("```sql")[1].split("```")[0]


def test_the_grants_the_docs_give_a_role_are_enough_and_fewer_are_refused(
        up: Cluster, workdir: Path, scope_file: Path) -> None:
    owner, writer, s = "crm_owner", "runner_writer", "crm"
    up.execute(GRANTS.format(owner=owner, writer=writer, s=s))
    page = (Path(__file__).resolve().parent.parent / "docs" / "how-to"
            / "postgresql-target.md").read_text()
    # the table made for runner by its owner, with its identity, as the docs show
    up.execute(f"SET ROLE {owner}; " + _sql_after(page, "table-ddl"))
    dsn = f"postgresql://{writer}@127.0.0.1:{up.port}/postgres"
    store = _store(workdir, scope_file, 3, dsn)
    table = ("--target-table", f"{s}.leads")
    # no grant on the table yet: refused before anything is sent
    proc = store.once(*table)
    assert proc.returncode == 77, proc.stderr
    assert "may not INSERT or SELECT on the table crm.leads" in proc.stderr
    up.execute(f"GRANT SELECT ON {s}.leads TO {writer}")
    assert "may not INSERT on" in store.once(*table).stderr
    assert {r["state"] for r in store.all_records()} == {"prepared"}
    up.execute(_sql_after(page, "table-grant"))
    assert store.cli("once", *table)["confirmed"] == 3
    assert up.fetch(f"SELECT count(*) FROM {s}.leads") == [(3,)]
    # a table without an identity: only its owner can write one, and runner says so
    up.execute(f"SET ROLE {owner}; CREATE TABLE {s}.other (LIKE {s}.leads INCLUDING ALL);"
               f"GRANT SELECT, INSERT ON {s}.other TO {writer}")
    other = CliStore(workdir, scope_file, workdir / "other.db")
    other.target = dsn  # type: ignore[assignment]
    other.accept(1)
    proc = other.once("--target-table", f"{s}.other")
    assert proc.returncode == 77, proc.stderr
    assert "only its owner may write" in proc.stderr
    assert up.fetch(f"SELECT obj_description('{s}.other'::regclass)") == [(None,)]
