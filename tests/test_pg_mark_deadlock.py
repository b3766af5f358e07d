"""A batch's in-flight mark chosen as a deadlock victim is run again (found by
``bench/forget.py --mode sync``: ``start`` beside concurrent ``accept`` callers on
PostgreSQL exited 75, "the store kept aborting a write as a deadlock victim", after a
few batches, with no failover at all).

Why it deadlocks: an accept's insert counts the new leads (``lead_counts``, trigger
``lead_counts_insert``) before it numbers their outbox events (the ``outbox_counter``
row, ``leads_accepted``); a mark's update numbers its ``state_changed`` events (the
counter) before it moves the counts (``leads_updated``).  The server aborts one of the
two.  A single statement is run again (``PostgresBase._fetch``); the mark of a batch to
a marking target is two statements in one transaction (the mark and the batch's seq,
SPEC E8), which was not: the whole transaction was rolled back (nothing marked, nothing
sent), and ``start`` stopped.

The deadlock is made exactly: another session holds the ``lead_counts`` row of
``prepared``, as an accept does, and then asks for the counter row the mark holds; its
``deadlock_timeout`` is long, so the mark's session is the one that finds the cycle and
is aborted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import asyncpg
import pytest

from runner.io.stores import open_store
from runner.leads.intake import prepare
from runner.leads.models import Scope, WriteId
from runner.store import AcceptItem, Store
from tests import pg
from tests.helpers import event
from tests.pipeline_fixtures import NOW

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db() -> Iterator[str]:
    pg.require()
    schema = pg.pooled_schema()
    yield pg.location(schema)
    pg.give_back(schema)


@pytest.fixture
async def store(db: str, scope: Scope) -> AsyncIterator[Store]:
    async with await open_store(db, scope=scope) as opened:
        yield opened


async def test_a_mark_aborted_as_a_deadlock_victim_is_run_again(
        store: Store, scope: Scope, db: str) -> None:
    ev, text = prepare(event(1), scope)
    await store.accept_many([AcceptItem(ev, text, WriteId("w-1"))], NOW)
    schema = pg.schema_of(db)
    pid = store._conn.get_server_pid()  # type: ignore[attr-defined]
    other = await asyncpg.connect(pg.dsn())
    try:
        await other.execute("SET deadlock_timeout = '20s'")
        tx = other.transaction()
        await tx.start()
        await other.execute(f"UPDATE \"{schema}\".lead_counts SET n = n "
                            "WHERE state = 'prepared'")

        async def then_the_counts() -> None:
            # once the mark waits for the counts (it holds the counter by then): a
            # condition of the server, asked of it (no event to wait on)
            with anyio.fail_after(20):
                while not await other.fetchval(  # noqa: ASYNC110
                        "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1",
                        pid):
                    await anyio.sleep(0.01)
            await other.execute(f'SELECT 1 FROM "{schema}".outbox_counter FOR UPDATE')
            await tx.rollback()

        async with anyio.create_task_group() as tg:
            tg.start_soon(then_the_counts)
            async with store.worker_lock():
                marked, seq = await store.mark_batch([], [WriteId("w-1")], NOW)
    finally:
        await other.close()
    assert marked == {WriteId("w-1"): 1} and seq
    assert [r.state.value async for r in store.iter_records()] == ["in_flight"]
