"""SQLite specifics of the lifecycle: the schema enforces T2, T5, T6 and the transition
table itself; the sweeps are guarded, set-based and read only the rows they may change."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.candidates import CandidateStatus, rules
from runner.clock import to_text
from runner.errors import RuleViolation
from runner.io.sqlite import schema
from runner.io.sqlite.base import QUERIES
from runner.io.stores import open_store
from runner.store import Store
from tests.helpers import ROOT
from tests.lifecycle_fixtures import add, at, promoted, promoting, statuses

S = CandidateStatus


@pytest.fixture
def sqlite_path(db_location: str, backend: str) -> Path:
    if backend != "sqlite":
        pytest.skip("SQLite file specifics")
    return Path(db_location)


@pytest.fixture
def raw(sqlite_path: Path, store: Store) -> Iterator[sqlite3.Connection]:
    """A second, plain connection to the same store (autocommit)."""
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    try:
        yield conn
    finally:
        conn.close()


def refused(raw: sqlite3.Connection, sql: str, *params: object) -> str:
    with pytest.raises(sqlite3.DatabaseError) as info:
        raw.execute(sql, params)
    return str(info.value)


async def test_rows_are_never_deleted(store: Store, raw: sqlite3.Connection) -> None:
    await add(store, "c-expired")
    await promoting(store, "c-rejected", at(1), decision=None)
    await promoted(store, "c-promoted", at(1))
    await store.sweep_candidates(at(31))
    for table in ("candidates", "candidate_analyses"):
        assert "never deleted" in refused(raw, f"DELETE FROM {table}")
    assert "never deleted" in refused(raw, "DELETE FROM candidates WHERE status = 'expired'")
    assert raw.execute("SELECT count(*) FROM candidates").fetchone()[0] == 3


async def test_promoted_rejected_and_expired_rows_never_change(
    store: Store, raw: sqlite3.Connection
) -> None:
    await add(store, "c-expired")
    await promoting(store, "c-rejected", at(1), decision=None)
    await promoted(store, "c-promoted", at(1))
    await store.sweep_candidates(at(31))
    for cid in ("c-expired", "c-rejected", "c-promoted"):
        for change in ("updated_at = 'x'", "reason = 'x'", "updated_at = updated_at"):
            message = refused(raw, f"UPDATE candidates SET {change} WHERE id = ?", cid)
            assert "never change" in message
        message = refused(raw, "UPDATE candidates SET status = 'analyzing' WHERE id = ?", cid)
        assert "never change" in message or "illegal" in message
    assert await statuses(store) == {
        "c-expired": "expired", "c-rejected": "rejected", "c-promoted": "promoted"}


#: statements the schema refuses, and a word of each refusal
SCHEMA_REFUSALS = {
    # born discovered, with nothing else
    "INSERT INTO candidates (id, status, created_at, expires_at, analysis_deadline, "
    "updated_at) VALUES ('x', 'promoted', 'a', 'b', 'b', 'a')": "created discovered",
    # T2 is a CHECK
    "INSERT INTO candidates (id, created_at, expires_at, analysis_deadline, updated_at) "
    "VALUES ('x', 'a', 'b', 'c', 'a')": "CHECK",
    "UPDATE candidates SET status = 'promoted' WHERE id = 'c2'": "illegal",
    "UPDATE candidates SET expires_at = 'z' WHERE id = 'c2'": "never change",
    "UPDATE candidates SET analyses = 2 WHERE id = 'c1'": "analyses counts",
    "UPDATE candidates SET decision_id = 'd' WHERE id = 'c2'": "decision is recorded once",
    "UPDATE candidates SET promotion_locked_at = 'x' WHERE id = 'c2'": "set only by",
    # promoting needs quorum
    "UPDATE candidates SET status = 'promoting', promotion_locked_at = "
    "'2026-08-11T12:01:00.000000Z' WHERE id = 'c1'": "CHECK",
    # an expired candidate is never promoted, whatever the query
    "UPDATE candidates SET status = 'promoting', promotion_locked_at = "
    "'2026-08-11T12:30:00.000001Z' WHERE id = 'c2'": "never promoted",
    "INSERT INTO candidate_analyses (candidate_id, analyst, analyzed_at) "
    "VALUES ('c1', 'a9', '2026-08-11T12:30:00.000001Z')": "before the analysis deadline",
    "UPDATE candidate_analyses SET analyst = 'x'": "never change",
}


async def test_the_schema_refuses_what_the_rules_forbid(
    store: Store, raw: sqlite3.Connection
) -> None:
    await add(store, "c1", analysts=("a1",))
    await add(store, "c2", analysts=("a1", "a2"))
    for sql, message in SCHEMA_REFUSALS.items():
        assert message in refused(raw, sql), sql


async def test_every_change_has_its_event_with_the_rule_that_made_it(
    store: Store, raw: sqlite3.Connection
) -> None:
    await add(store, "t3")
    await add(store, "t4", analysts=("a1",), deadline=at(10))
    await promoting(store, "stuck", at(1), decision="d1")
    await store.sweep_candidates(at(11))
    await store.sweep_candidates(at(31))
    rows = raw.execute(
        "SELECT subject, json_extract(payload, '$.from'), json_extract(payload, '$.to'), "
        "json_extract(payload, '$.reason') FROM outbox WHERE kind = 'candidate_changed' "
        "AND json_extract(payload, '$.to') IN ('expired', 'promoted') ORDER BY seq"
    ).fetchall()
    assert rows == [
        ("t4", "analyzing", "expired", "T4"),
        ("stuck", "promoting", "promoted", "reconciled: decision recorded"),
        ("t3", "discovered", "expired", "T3"),
    ]
    seqs = [s for (s,) in raw.execute("SELECT seq FROM outbox ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))  # gap-free


async def test_the_sweeps_read_only_the_rows_they_may_change(raw: sqlite3.Connection) -> None:
    """T5 "never scanned": each sweep statement searches a partial index that holds only
    discovered/analyzing (or promoting) rows, so promoted rows are not even read."""
    for sql, params, index in (
        (QUERIES["expire_candidates"].sql, {"now": "x"}, "candidates_to_expire"),
        (QUERIES["reconcile_stuck_promoting"].sql, {"now": "x", "cutoff": "x"},
         "candidates_promoting"),
    ):
        plan = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, params))
        assert f"SEARCH candidates USING INDEX {index}" in plan
        assert "SCAN" not in plan


def test_the_named_sql_spells_the_active_term_as_the_expiry_index_does() -> None:
    """The named SQL writes the active statuses out; the schema builds them from
    ``runner.candidates.states``: both must stay the same term (SQLite matches a partial
    index only by the identical term)."""
    from runner.io.engine.queries import load
    from runner.io.postgres import candidates_schema as pg_schema
    from runner.io.sqlite import candidates_schema as sqlite_schema

    for package, term in (("runner.io.sqlite", sqlite_schema.ACTIVE_TERM),
                          ("runner.io.postgres", pg_schema.ACTIVE_TERM)):
        queries = load(package)
        for name in ("analyze_candidate", "begin_promotion", "expire_candidates"):
            assert term in queries[name].sql, (package, name)


# -- races: a guarded write never overwrites a transition that committed first -------------


async def test_a_promotion_committed_between_the_sweeps_read_and_write_is_not_overwritten(
    db_location: str, store: Store, raw: sqlite3.Connection
) -> None:
    await add(store, "c-race", analysts=("a1", "a2"))
    late = at(30, seconds=1)
    # the sweep's read: at `late` the candidate looks expirable (analyzing, past expiry)
    seen = [cid for (cid,) in raw.execute(
        "SELECT id FROM candidates WHERE status IN ('discovered', 'analyzing') "
        "AND expires_at < ?", (to_text(late),))]
    assert seen == ["c-race"]
    # another process's promotion commits in between (it locked while still unexpired)
    async with await open_store(db_location) as promoter:
        await promoter.begin_promotion("c-race", at(29))
    # the sweep's write: the status guard is evaluated at write time
    assert await store.sweep_expired(late) == {"expired": 0}
    assert (await statuses(store)) == {"c-race": "promoting"}
    # a write that trusted the earlier read would have overwritten the promotion; the
    # schema refuses it as well (promoting -> expired is not in the transition table)
    assert "illegal" in refused(raw, "UPDATE candidates SET status = 'expired' WHERE id = ?",
                                *seen)
    assert (await statuses(store)) == {"c-race": "promoting"}


async def test_a_decision_committed_between_the_reconcilers_read_and_write_promotes(
    db_location: str, store: Store, raw: sqlite3.Connection
) -> None:
    await promoting(store, "c1", at(1), decision=None)
    now = at(2, seconds=1)
    undecided = raw.execute("SELECT id FROM candidates WHERE status = 'promoting' "
                            "AND decision_id IS NULL").fetchall()
    assert undecided == [("c1",)]                     # what a read-then-write would reject
    async with await open_store(db_location) as decider:
        await decider.record_decision("c1", "d1", now)
    assert await store.reconcile_stuck_promoting(now) == {"reconciled": 1}
    assert (await statuses(store)) == {"c1": "promoted"}


async def test_an_expiry_committed_between_promotes_check_and_write_refuses_the_promotion(
    db_location: str, store: Store
) -> None:
    await add(store, "c1", analysts=("a1", "a2"))
    stale = await store.get_candidate("c1")
    assert rules.promotion_refusal(stale, "c1", at(29)) is None   # the check passes
    async with await open_store(db_location) as sweeper:
        assert await sweeper.sweep_expired(at(31)) == {"expired": 1}
    with pytest.raises(RuleViolation, match="it is expired"):
        await store.begin_promotion("c1", at(29))
    assert (await statuses(store)) == {"c1": "expired"}


# -- migration -----------------------------------------------------------------------------


async def test_a_v1_store_is_upgraded_and_keeps_its_leads(workdir: Path) -> None:
    db = workdir / "old.db"
    shutil.copyfile(ROOT / "tests" / "fixtures" / "store-v1.sqlite", db)
    db.chmod(0o600)
    async with await open_store(str(db)) as upgraded:
        assert upgraded.schema_version == schema.LATEST
        assert len([r async for r in upgraded.iter_records()]) == 3
        await add(upgraded, "c1")
        assert (await upgraded.candidate_summary()).counts[S.DISCOVERED] == 1


# -- the same invariants on PostgreSQL ---------------------------------------------------


@pytest.fixture
def pg_refused(db_location: str, backend: str, store: Store) -> Callable[[str], str]:
    """Runs raw SQL against the PostgreSQL store (its schema first on the search path)
    and returns the error it must raise."""
    if backend != "postgres":
        pytest.skip("PostgreSQL schema specifics")
    import asyncpg

    from tests import pg

    def run(sql: str) -> str:
        with pytest.raises(asyncpg.PostgresError) as info:
            pg.execute(f'SET search_path = "{pg.schema_of(db_location)}"; {sql}')
        return str(info.value).replace("check constraint", "CHECK")

    return run


async def test_pg_schema_refuses_what_the_rules_forbid(
    store: Store, pg_refused: Callable[[str], str]
) -> None:
    await add(store, "c1", analysts=("a1",))
    await add(store, "c2", analysts=("a1", "a2"))
    for sql, message in SCHEMA_REFUSALS.items():
        assert message in pg_refused(sql), sql


async def test_pg_rows_are_kept_and_terminal_rows_never_change(
    store: Store, pg_refused: Callable[[str], str]
) -> None:
    await add(store, "c-expired")
    await promoting(store, "c-rejected", at(1), decision=None)
    await promoted(store, "c-promoted", at(1))
    await store.sweep_candidates(at(31))
    for table in ("candidates", "candidate_analyses"):
        assert "never deleted" in pg_refused(f"DELETE FROM {table}")
        assert "never deleted" in pg_refused(f"TRUNCATE {table} CASCADE")
    for cid in ("c-expired", "c-rejected", "c-promoted"):
        for change in ("updated_at = 'x'", "reason = 'x'", "updated_at = updated_at"):
            assert "never change" in pg_refused(
                f"UPDATE candidates SET {change} WHERE id = '{cid}'")
    assert await statuses(store) == {
        "c-expired": "expired", "c-rejected": "rejected", "c-promoted": "promoted"}
