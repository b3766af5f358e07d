"""A batch's in-flight mark beside concurrent accepts on PostgreSQL (found by
``bench/forget.py --mode sync`` and ``--mode async-lag``: ``start`` beside concurrent
``accept`` callers exited 75, "the store kept aborting a write as a deadlock victim",
after a few batches, with no failover at all).

Why it deadlocked: an accept's insert counts the new leads (``lead_counts``, trigger
``lead_counts_insert``) before it numbers their outbox events (the ``outbox_counter``
row, ``leads_accepted``); a mark's update numbers its ``state_changed`` events (the
counter) before it moves the counts (``leads_updated``).  The server aborts one of the
two.  A single statement is run again (``PostgresBase._fetch``); the mark of a batch to
a marking target is two statements in one transaction (the mark and the batch's seq,
SPEC E8), which was not: the whole transaction was rolled back (nothing marked, nothing
sent), and ``start`` stopped.  Retrying alone did not hold under a steady stream of
accepts (5 attempts, all victims, in the async-lag campaign).  The mark's transaction
then locked ``lead_counts`` first, in the accept's order; since schema v20 its trigger
does (``leads_updated`` moves the counts before it takes the counter), and the
transaction is run again if another writer makes it a victim all the same.

Each deadlock is made exactly with another session; its ``deadlock_timeout`` is long, so
the mark's session is the one that finds a cycle, if there is one, and is aborted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

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
async def store(pg_db: str, scope: Scope) -> AsyncIterator[Store]:
    async with await open_store(pg_db, scope=scope) as opened:
        yield opened


async def _mark_beside(store: Store, scope: Scope, pg_db: str, first: str,
                       then: str) -> tuple[dict[WriteId, int], int]:
    """Another session takes ``first``, waits until the mark waits, then takes ``then``
    and rolls back; the mark's result."""
    ev, text = prepare(event(1), scope)
    await store.accept_many([AcceptItem(ev, text, WriteId("w-1"))], NOW)
    schema = pg.schema_of(pg_db)
    pid = store._conn.get_server_pid()  # type: ignore[attr-defined]
    other = await asyncpg.connect(pg.dsn())
    try:
        await other.execute("SET deadlock_timeout = '20s'")
        tx = other.transaction()
        await tx.start()
        await other.execute(first.format(s=schema))

        async def and_then() -> None:
            # once the mark waits for the other's first lock: a condition of the
            # server, asked of it (no event to wait on)
            with anyio.fail_after(20):
                while not await other.fetchval(  # noqa: ASYNC110
                        "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1",
                        pid):
                    await anyio.sleep(0.01)
            with anyio.move_on_after(5):  # waits for the mark (no cycle), else granted
                await other.execute(then.format(s=schema))
            await tx.rollback()

        async with anyio.create_task_group() as tg:
            tg.start_soon(and_then)
            async with store.worker_lock():
                result = await store.mark_batch([], [WriteId("w-1")], NOW)
    finally:
        await other.close()
    assert [r.state.value async for r in store.iter_records()] == ["in_flight"]
    return result


COUNTS = "UPDATE \"{s}\".lead_counts SET n = n WHERE state = 'prepared'"
COUNTER = 'SELECT 1 FROM "{s}".outbox_counter FOR UPDATE'


async def test_a_mark_beside_an_accept_takes_the_locks_in_its_order_and_never_deadlocks(
        store: Store, scope: Scope, pg_db: str) -> None:
    """The accept's order (the counts, then the counter): the mark waits its turn; run
    once only, so an abort would fail it."""
    store.mark_attempts = 1  # type: ignore[attr-defined]
    marked, seq = await _mark_beside(store, scope, pg_db, COUNTS, COUNTER)
    assert marked == {WriteId("w-1"): 1} and seq


async def test_a_mark_aborted_as_a_deadlock_victim_is_run_again(
        store: Store, scope: Scope, pg_db: str) -> None:
    """The other order (the counter, then the counts) makes a cycle with the mark: the
    mark's session aborts it, and it is run again once the other has rolled back."""
    marked, seq = await _mark_beside(store, scope, pg_db, COUNTER, COUNTS)
    assert marked == {WriteId("w-1"): 1} and seq
