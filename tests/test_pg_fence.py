"""The PostgreSQL store and lock across a lost session (issue 30 point 3), in process on
the shared server (sessions are ended with ``pg_terminate_backend``; the server itself is
never stopped): no in-flight mark passes once the lock's session is gone or belongs to
another server instance, a reconnected store keeps a lock whose session lived and takes
again one whose session ended (or is refused, exit 75, when another worker has it), a
reconnect never creates a store nor adopts another one, and a pipeline claim stays
fenced by its token across a reconnect."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import pytest

from runner.clock import FixedClock
from runner.errors import ConfigMismatch, LockHeld, LockLost, StoreNotFound, StoreUnavailable
from runner.io.stores import open_store
from runner.leads.intake import prepare
from runner.leads.models import Scope, WriteId
from runner.pipeline.engine import WorkerSettings, completions
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.jobs import run_job
from runner.pipeline.model import LeaseLost
from runner.pipeline.plugins import default_registry
from runner.store import AcceptItem, Store
from tests import pg
from tests.helpers import event
from tests.pipeline_fixtures import NOW, lead_history, level

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(pg_db: str, scope: Scope) -> AsyncIterator[Store]:
    async with await open_store(pg_db, scope=scope) as opened:
        yield opened


async def accepted(store: Store, scope: Scope, *ids: int) -> list[WriteId]:
    items = []
    for i in ids:
        ev, text = prepare(event(i), scope)
        items.append(AcceptItem(ev, text, WriteId(f"w-{i}")))
    await store.accept_many(items, NOW)
    return [item.write_id for item in items]


def terminate(pid: int) -> None:
    pg.execute("SELECT pg_terminate_backend($1)", pid)


def session_of(store: Store) -> int:
    return int(store._conn.get_server_pid())  # type: ignore[attr-defined]


async def states(store: Store) -> list[tuple[str, str, int]]:
    return [(r.source_lead_id, r.state.value, r.attempts) async for r in store.iter_records()]


async def test_a_lock_whose_session_ends_refuses_every_mark_at_once(
        store: Store, scope: Scope) -> None:
    ids = await accepted(store, scope, 1, 2)
    async with store.worker_lock() as lock:
        pid = lock._fence.backend_pid  # type: ignore[attr-defined]
        terminate(pid)
        with anyio.fail_after(10):
            await lock.wait_lost()  # the session's end is heard, not polled for
        assert lock.lost
        with pytest.raises(LockLost):
            await store.finish_and_mark_batch([], ids, NOW)
        with pytest.raises(LockLost):
            await store.finish_and_mark(None, ids[0], NOW)
    assert await states(store) == [("lead-1", "prepared", 0), ("lead-2", "prepared", 0)]


async def test_a_fence_of_another_server_instance_passes_no_mark(
        store: Store, scope: Scope) -> None:
    """The same backend pid on another instance (after a restart, on another host) is
    another session: the fence names the instance by its start time."""
    ids = await accepted(store, scope, 1)
    async with store.worker_lock():
        fence = store._fence  # type: ignore[attr-defined]
        store._fence = dataclasses.replace(  # type: ignore[attr-defined]
            fence, started=fence.started - timedelta(microseconds=1))
        with pytest.raises(LockLost):
            await store.finish_and_mark_batch([], ids, NOW)
        assert await states(store) == [("lead-1", "prepared", 0)]
        store._fence = fence  # type: ignore[attr-defined]
        assert await store.finish_and_mark_batch([], ids, NOW) == {ids[0]: 1}


async def test_a_reconnected_store_keeps_a_live_lock_and_takes_a_lost_one_again(
        store: Store, scope: Scope) -> None:
    ids = await accepted(store, scope, 1, 2)
    async with store.worker_lock() as lock:
        before = store._fence  # type: ignore[attr-defined]
        terminate(session_of(store))  # the store's session only
        with pytest.raises(StoreUnavailable):
            async with store.transaction():  # a closed session: classified, not raw
                pass
        await store.reconnect()
        assert await lock.regain() is True  # its own session lived: kept, same fence
        assert store._fence is before  # type: ignore[attr-defined]
        assert await store.finish_and_mark_batch([], ids[:1], NOW) == {ids[0]: 1}

        terminate(before.backend_pid)  # now the lock's session
        with anyio.fail_after(10):
            await lock.wait_lost()
        await store.reconnect()
        assert await lock.regain() is False  # taken anew: what was in flight is recovered
        after = store._fence  # type: ignore[attr-defined]
        assert after.backend_pid != before.backend_pid and not lock.lost
        assert await store.recover_in_flight(NOW) == ["lead-1"]
        assert await store.finish_and_mark_batch([], ids[1:], NOW) == {ids[1]: 1}
    assert await states(store) == [("lead-1", "uncertain", 1), ("lead-2", "in_flight", 1)]


async def test_a_lock_taken_by_another_worker_meanwhile_is_refused_and_fences_all(
        store: Store, scope: Scope, pg_db: str) -> None:
    ids = await accepted(store, scope, 1)
    async with store.worker_lock() as lock:
        terminate(store._fence.backend_pid)  # type: ignore[attr-defined]
        with anyio.fail_after(10):
            await lock.wait_lost()
        async with await open_store(pg_db, scope=scope) as other, other.worker_lock():
            await store.reconnect()
            with pytest.raises(LockHeld, match="holds the lock"):
                await lock.regain()
            with pytest.raises(LockLost):  # refused without a statement
                await store.finish_and_mark_batch([], ids, NOW)
            assert await other.finish_and_mark_batch([], ids, NOW) == {ids[0]: 1}
    assert await states(store) == [("lead-1", "in_flight", 1)]


async def test_a_reconnect_never_creates_a_store_nor_takes_another_one(
        pg_db: str, scope: Scope) -> None:
    schema = pg.schema_of(pg_db)
    async with await open_store(pg_db, scope=scope) as store:
        pg.execute(f"""UPDATE "{schema}".meta SET value = $1 WHERE key = 'scope'""",
                   scope.model_copy(update={"form_id": "another-form"}).model_dump_json())
        with pytest.raises(ConfigMismatch, match="not the one this run opened"):
            await store.reconnect()
        pg.execute(f"""UPDATE "{schema}".meta SET value = $1 WHERE key = 'scope'""",
                   scope.model_dump_json())
        await store.reconnect()  # the same store again: fine
        assert await store.uncertain_count() == 0
        moved = pg.new_schema()
        pg.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{moved}"')
        try:
            with pytest.raises(StoreNotFound):
                await store.reconnect()
            assert not pg.exists(pg_db)  # nothing was made in its place
        finally:
            pg.execute(f'ALTER SCHEMA "{moved}" RENAME TO "{schema}"')


async def test_a_claim_stays_fenced_by_its_token_across_a_reconnect(
        store: Store, scope: Scope, pg_db: str) -> None:
    ref, lease, t0 = LeadFacts.ref, 30_000, 1_700_000_000_000
    await lead_history(store, scope, 3)
    await run_job(store, "backfill", registry=default_registry(), clock=FixedClock(NOW))
    await store.register_processors([ref], t0)
    old = await store.claim(ref, "worker-a", 10, lease, t0)
    assert len(old.items) == 3
    terminate(session_of(store))  # the old owner loses its session mid-batch
    await store.reconnect()
    later = t0 + lease + 1
    async with await open_store(pg_db) as other:
        new = await other.claim(ref, "worker-b", 10, lease, later)
        assert [i.input_id for i in new.items] == [i.input_id for i in old.items]
        retry = WorkerSettings().retry
        outcomes = list(await LeadFacts().process(old.items))
        with pytest.raises(LeaseLost):  # the old owner's completion: refused, no write
            await store.complete(old, completions(old, outcomes, retry, later), later)
        assert await level(store, 2) == {}
        await other.complete(new, completions(new, outcomes, retry, later), later)
    assert len(await level(store, 2)) == 3
    rows = pg.fetch(f'SELECT state, owner, count(*) FROM "{pg.schema_of(pg_db)}".pipeline_work '
                    "GROUP BY 1, 2")
    assert rows == [("done", "worker-b", 3)]


async def test_a_claim_that_could_not_be_given_back_is_given_back_after_the_reconnect(
        store: Store, scope: Scope, pg_db: str) -> None:
    """Not left to its lease: a worker that lost its session mid-batch frees what it held
    as soon as it is back (by its token: nobody else's claim is touched)."""
    ref, lease, t0 = LeadFacts.ref, 30_000, 1_700_000_000_000
    await lead_history(store, scope, 2)
    await run_job(store, "backfill", registry=default_registry(), clock=FixedClock(NOW))
    await store.register_processors([ref], t0)
    claim = await store.claim(ref, "worker-a", 10, lease, t0)
    terminate(session_of(store))
    with pytest.raises(StoreUnavailable):
        await store.release(claim, t0 + 1)
    async with await open_store(pg_db) as other:
        assert (await other.claim(ref, "worker-b", 10, lease, t0 + 2)).items == ()  # held
        await store.reconnect()  # gives it back
        again = await other.claim(ref, "worker-b", 10, lease, t0 + 2)  # well within the lease
        assert [i.input_id for i in again.items] == [i.input_id for i in claim.items]
