"""The statements that change a known set of leads find them by ``write_id`` (the unique
index), never through the state index: a state test the planner takes as an index
condition makes it read every record in that state for each page or batch, a cost that
grows with the store (a poll page read every confirmed record: 71-78 ms at 100,000 on
SQLite). Checked on the plans of a fresh store, which has no statistics either
(PostgreSQL may also scan a table that small whole, which is right for it)."""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from runner.io.engine.queries import load
from runner.store import Store

pytestmark = pytest.mark.timeout(60)

# the statements that change leads named by write_id, with a value for each parameter
BY_WRITE_ID: dict[str, dict[str, Any]] = {
    "observe_polled": {"at": "2026-01-01T00:00:00Z", "write_ids": ["w1", "w2"]},
    "observe_missing": {"at": "2026-01-01T00:00:00Z", "write_ids": ["w1", "w2"],
                        "missing_snapshot": "{}"},
    "observe_changed": {"at": "2026-01-01T00:00:00Z", "changes": [["w1", "{}"]]},
    "finish_and_mark_batch": {"now": "2026-01-01T00:00:00Z", "done": ["w1"],
                              "outcomes": ["confirmed"], "next": ["w2"], "retry_at": None,
                              "reason": None, "failure": None},
    "record_reconcile_batch": {"now": "2026-01-01T00:00:00Z", "write_ids": ["w1"],
                               "outcomes": [None], "notes": [None]},
    "record_operator_decisions": {"decision": "not_sent", "reason": "r", "readback": "none",
                                  "at": "2026-01-01T00:00:00Z", "write_ids": ["w1", "w2"],
                                  "attempts": [1, 1]},
    "leave_uncertain_many": {"state": "failed_safe", "at": "2026-01-01T00:00:00Z",
                             "write_ids": ["w1", "w2"], "attempts": [1, 1]},
}
STATE_INDEXES = ("leads_by_state", "leads_poll_order")


def _sqlite_plan(path: str, name: str, values: dict[str, Any]) -> list[str]:
    sql = load("runner.io.sqlite")[name].sql
    params = {k: json.dumps(v) if isinstance(v, list) else v for k, v in values.items()}
    with sqlite3.connect(path) as conn:
        return [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


async def _postgres_plan(dsn: str, name: str, values: dict[str, Any]) -> list[str]:
    import asyncpg

    parts = urlsplit(dsn)
    schema = parse_qs(parts.query)["schema"][0]
    query = load("runner.io.postgres")[name]
    sql = query.numbered().replace("{s}", f'"{schema}"')
    args = [values[p] for p in query.params]
    conn = await asyncpg.connect(parts._replace(query="").geturl())
    try:
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + sql, *args)
    finally:
        await conn.close()
    return [str(row[0]) for row in rows]


@pytest.mark.parametrize("name", sorted(BY_WRITE_ID))
async def test_a_statement_on_named_leads_finds_them_by_write_id(
    store: Store, db_location: str, backend: str, name: str
) -> None:
    values = BY_WRITE_ID[name]
    if backend == "sqlite":
        plan = _sqlite_plan(db_location, name, values)
        by_write_id = [line for line in plan
                       if re.search(r"\bleads USING .*\(write_id=\?\)", line)]
    else:
        plan = await _postgres_plan(db_location, name, values)
        # a store the pool emptied keeps its table's pages, and on a table that small a
        # sequential scan is the planner's right choice; never the state indexes
        by_write_id = [line for line in plan
                       if "leads_write_id_key" in line or "Seq Scan on leads" in line]
    assert by_write_id, plan
    assert not [line for line in plan if any(index in line for index in STATE_INDEXES)], plan


@pytest.mark.parametrize("name", ["poll_page", "clamp_poll_times"])
async def test_the_poll_pass_walks_the_poll_order_index_of_confirmed_records(
    store: Store, db_location: str, backend: str, name: str
) -> None:
    """v19: ``leads_poll_order`` holds the confirmed records only; the poll page walks it
    in order (no sort of every confirmed record found by the state index)."""
    if backend != "sqlite":
        pytest.skip("PostgreSQL plans by its statistics; on a fresh table a scan is right")
    plan = _sqlite_plan(db_location, name, {"limit": 100, "at": "2026-01-01T00:00:00Z"})
    assert [line for line in plan if "USING INDEX leads_poll_order" in line], plan
    assert not [line for line in plan if "TEMP B-TREE" in line], plan
    with sqlite3.connect(db_location) as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'leads_poll_order'"
                              ).fetchone()
    assert "WHERE state = 'confirmed'" in sql
