"""Issue 15 point 2: the target is pinned like the scope (SPEC L9).
"""

from __future__ import annotations

import sqlite3

import pytest

from runner.io.postgres import schema as pg_schema
from runner.io.sqlite import schema as sqlite_schema
from runner.store import open_store
from tests import pg


def test_the_pin_is_in_a_migration_of_its_own_and_never_changes(db_location: str) -> None:
    assert sqlite_schema.LATEST == pg_schema.LATEST == 6
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
