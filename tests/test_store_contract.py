"""The Store contract, run against every backend through the ``store`` fixture."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner.errors import ConfigMismatch
from runner.io.stores import open_store
from runner.leads.intake import prepare
from runner.leads.models import Scope, WriteId
from runner.leads.states import LeadState
from runner.status import iter_record_json, status_document
from runner.store import Store
from tests import pg
from tests.helpers import event

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def accept(store: Store, scope: Scope, i: int | str, write_id: str = "", **kw: object):
    ev, text = prepare(event(i, **kw), scope)
    return await store.accept(ev, text, WriteId(write_id or f"w-{i}"), NOW)


async def test_accept_new_duplicate_conflict(store: Store, scope: Scope) -> None:
    first = await accept(store, scope, 1)
    assert (first.result, first.write_id) == ("accepted", "w-1")
    again = await accept(store, scope, 1, write_id="w-other")
    assert (again.result, again.write_id) == ("duplicate", "w-1")  # allocated once
    changed = await accept(store, scope, 1, write_id="w-other", contact_alias="changed")
    assert changed.result == "conflict"
    summary = await store.summary()
    assert summary.counts[LeadState.PREPARED] == 1
    assert summary.outbox_by_kind == {"accepted": 1}


async def test_same_content_in_another_key_order_is_a_duplicate(
    store: Store, scope: Scope
) -> None:
    await accept(store, scope, 1)
    reordered = dict(reversed(list(event(1).items())))
    ev, text = prepare(reordered, scope)
    assert (await store.accept(ev, text, WriteId("w-x"), NOW)).result == "duplicate"


async def test_write_id_survives_reopen(db_location: str, scope: Scope) -> None:
    async with await open_store(db_location, scope=scope) as s1:
        await accept(s1, scope, 1)
    async with await open_store(db_location, scope=scope) as s2:
        assert (await accept(s2, scope, 1, write_id="w-new")).write_id == "w-1"
        rows = [r async for r in s2.iter_records()]
    assert [(r.source_lead_id, r.write_id, r.state) for r in rows] == [
        ("lead-1", "w-1", LeadState.PREPARED)
    ]


async def test_status_counts_every_state_and_streams_in_accept_order(
    store: Store, scope: Scope
) -> None:
    for i in (3, 1, 2):
        await accept(store, scope, i)
    doc = await status_document(store)
    assert doc["counts"] == {s.value: (3 if s is LeadState.PREPARED else 0) for s in LeadState}
    assert doc["uncertain"] == {"total": 0, "truncated": False, "records": []}
    listed = [r async for r in iter_record_json(store)]
    assert [r["source_lead_id"] for r in listed] == ["lead-3", "lead-1", "lead-2"]
    assert doc["outbox"] == {"count": 3, "last_seq": 3, "by_kind": {"accepted": 3}}
    assert doc["scope"] == scope.model_dump()


async def test_records_stream_in_pages(store: Store, scope: Scope) -> None:
    for i in range(25):
        await accept(store, scope, i)
    seen = [r.source_lead_id async for r in store.iter_records(page=7)]
    assert seen == [f"lead-{i}" for i in range(25)]


async def test_another_scope_is_refused_and_changes_nothing(
    db_location: str, scope: Scope
) -> None:
    async with await open_store(db_location, scope=scope) as s:
        await accept(s, scope, 1)
    other = scope.model_copy(update={"form_id": "another-form"})
    with pytest.raises(ConfigMismatch):
        await open_store(db_location, scope=other)
    async with await open_store(db_location, scope=None) as s:
        assert s.scope == scope


async def test_scope_is_pinned_by_the_first_command_that_takes_one(
    db_location: str, scope: Scope
) -> None:
    async with await open_store(db_location, scope=None) as s:
        assert s.scope is None
    async with await open_store(db_location, scope=scope) as s:
        assert s.scope == scope
    with pytest.raises(ConfigMismatch):
        await open_store(db_location, scope=scope.model_copy(update={"tenant_id": "t9"}))


# -- SQLite specifics: the schema enforces the invariants itself -----------------------


@pytest.fixture
def sqlite_path(db_location: str, backend: str) -> Path:
    if backend != "sqlite":
        pytest.skip("SQLite file specifics")
    return Path(db_location)


async def test_outbox_is_append_only_and_records_are_never_deleted(
    store: Store, scope: Scope, sqlite_path: Path
) -> None:
    await accept(store, scope, 1)
    raw = sqlite3.connect(sqlite_path)
    try:
        for sql in (
            "UPDATE outbox SET kind = 'x'",
            "DELETE FROM outbox",
            "DELETE FROM leads",
            "UPDATE leads SET write_id = 'other'",
            "UPDATE leads SET canonical = '{}'",
            "UPDATE leads SET state = 'confirmed'",  # prepared -> confirmed is illegal
            "UPDATE leads SET state = 'bogus'",
        ):
            with pytest.raises(sqlite3.DatabaseError):
                raw.execute(sql)
            raw.rollback()
        raw.execute("UPDATE leads SET state = 'in_flight', attempts = 1")
        raw.commit()
        kinds = [k for (k,) in raw.execute("SELECT kind FROM outbox ORDER BY seq")]
        assert kinds == ["accepted", "state_changed"]
        with pytest.raises(sqlite3.DatabaseError):
            raw.execute("UPDATE leads SET state = 'prepared'")
    finally:
        raw.close()


async def test_every_accept_writes_its_outbox_event_in_the_same_transaction(
    store: Store, scope: Scope, sqlite_path: Path
) -> None:
    for i in range(5):
        await accept(store, scope, i)
    raw = sqlite3.connect(sqlite_path)
    try:
        pairs = raw.execute(
            "SELECT l.source_lead_id, o.subject FROM leads l JOIN outbox o "
            "ON o.subject = l.source_lead_id AND o.kind = 'accepted' ORDER BY l.seq"
        ).fetchall()
        seqs = [s for (s,) in raw.execute("SELECT seq FROM outbox ORDER BY seq")]
    finally:
        raw.close()
    assert [a for a, _ in pairs] == [f"lead-{i}" for i in range(5)]
    assert seqs == list(range(1, 6))  # gap-free


async def test_records_say_whether_an_alias_is_present_never_its_value(
    store: Store, scope: Scope
) -> None:
    await accept(store, scope, 1)
    ev, text = prepare({k: v for k, v in event(2).items() if k != "contact_alias"}, scope)
    await store.accept(ev, text, WriteId("w-2"), NOW)
    rows = {r.source_lead_id: r async for r in store.iter_records()}
    assert rows["lead-1"].contact_alias_present is True
    assert rows["lead-2"].contact_alias_present is False
    found = await store.find_lead(scope.tenant_id, "lead-1")
    assert found is not None and found.contact_alias_present is True


# -- PostgreSQL specifics: the same invariants, enforced by the database ---------------


@pytest.fixture
def pg_schema(db_location: str, backend: str) -> str:
    if backend != "postgres":
        pytest.skip("PostgreSQL schema specifics")
    return f'"{pg.schema_of(db_location)}"'


async def test_pg_outbox_is_append_only_and_records_are_never_deleted(
    store: Store, scope: Scope, pg_schema: str
) -> None:
    import asyncpg

    await accept(store, scope, 1)
    s = pg_schema
    for sql in (
        f"UPDATE {s}.outbox SET kind = 'x'",
        f"DELETE FROM {s}.outbox",
        f"TRUNCATE {s}.outbox",
        f"DELETE FROM {s}.leads",
        f"TRUNCATE {s}.leads CASCADE",
        f"UPDATE {s}.leads SET write_id = 'other'",
        f"UPDATE {s}.leads SET canonical = '{{}}'",
        f"UPDATE {s}.leads SET tenant_id = 'other'",
        f"UPDATE {s}.leads SET state = 'confirmed'",  # prepared -> confirmed is illegal
        f"UPDATE {s}.leads SET state = 'bogus'",
        f"UPDATE {s}.outbox_counter SET last_seq = last_seq + 5",  # would leave a gap
        f"DELETE FROM {s}.outbox_counter",
    ):
        with pytest.raises(asyncpg.PostgresError):
            pg.execute(sql)
    pg.execute(f"UPDATE {s}.leads SET state = 'in_flight', attempts = 1")
    kinds = [k for (k,) in pg.fetch(f"SELECT kind FROM {s}.outbox ORDER BY seq")]
    assert kinds == ["accepted", "state_changed"]
    with pytest.raises(asyncpg.PostgresError, match="illegal lead transition"):
        pg.execute(f"UPDATE {s}.leads SET state = 'prepared'")


async def test_pg_outbox_sequence_has_no_gap_after_a_rollback(
    store: Store, scope: Scope, pg_schema: str
) -> None:
    await accept(store, scope, 1)
    s = pg_schema
    pg.execute(  # a write whose transaction rolls back takes its number back
        f"BEGIN; INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id, "
        f"accepted_at, updated_at) VALUES ('t', 'x', '{{}}', 'w-x', 'a', 'a'); ROLLBACK")
    await accept(store, scope, 2)
    rows = pg.fetch(f"SELECT seq, kind, subject FROM {s}.outbox ORDER BY seq")
    assert rows == [(1, "accepted", "lead-1"), (2, "accepted", "lead-2")]
    assert pg.fetch(f"SELECT last_seq FROM {s}.outbox_counter") == [(2,)]


async def test_pg_a_multi_row_statement_numbers_its_events_in_lead_order(
    store: Store, scope: Scope, pg_schema: str
) -> None:
    """One statement-level trigger numbers a whole statement's events (v11): still
    gap-free, in lead order, and for one lead in the order the row triggers had; the
    kept counts per state follow; the counter still refuses a direct jump."""
    import asyncpg

    s = pg_schema
    pg.execute(  # three leads in one INSERT
        f"INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id, "
        f"accepted_at, updated_at) SELECT 't', 'k' || i, '{{}}', 'w-k' || i, 'a', 'a' "
        f"FROM generate_series(1, 3) AS i")
    pg.execute(  # one UPDATE: two leads change state, one of them its snapshot as well
        f"UPDATE {s}.leads SET state = 'in_flight', attempts = 1, "
        f"snapshot = CASE WHEN source_lead_id = 'k1' THEN '{{\"status\": \"new\"}}' END "
        f"WHERE source_lead_id IN ('k1', 'k3')")
    pg.execute(f"UPDATE {s}.leads SET last_polled_at = 'b'")  # no event: no number taken
    rows = pg.fetch(f"SELECT seq, kind, subject FROM {s}.outbox ORDER BY seq")
    assert rows == [(1, "accepted", "k1"), (2, "accepted", "k2"), (3, "accepted", "k3"),
                    (4, "state_changed", "k1"), (5, "status_changed", "k1"),
                    (6, "state_changed", "k3")]
    assert pg.fetch(f"SELECT last_seq FROM {s}.outbox_counter") == [(6,)]
    counts = dict(pg.fetch(f"SELECT state, n FROM {s}.lead_counts WHERE n > 0"))
    assert counts == {"prepared": 1, "in_flight": 2}
    with pytest.raises(asyncpg.PostgresError, match="moves by one"):
        pg.execute(f"UPDATE {s}.outbox_counter SET last_seq = last_seq + 3")
    with pytest.raises(asyncpg.PostgresError, match="moves by one"):
        pg.execute(f"UPDATE {s}.outbox_counter SET last_seq = last_seq - 1")


async def test_pg_every_allowed_transition_and_only_those(
    store: Store, scope: Scope, pg_schema: str
) -> None:
    """The trigger's list is generated from runner.leads.states.TRANSITIONS: walk every edge."""
    import asyncpg

    from runner.leads.states import TRANSITIONS

    await accept(store, scope, 1)
    s = pg_schema
    path = {  # a legal way to reach each state from prepared
        LeadState.PREPARED: [],
        LeadState.IN_FLIGHT: ["in_flight"],
        LeadState.FAILED_SAFE: ["in_flight", "failed_safe"],
        LeadState.UNCERTAIN: ["in_flight", "uncertain"],
        LeadState.CONFIRMED: ["in_flight", "confirmed"],
        LeadState.CONFIRMED_THEN_MISSING: ["in_flight", "confirmed", "confirmed_then_missing"],
    }
    for src, steps in path.items():
        for dst in LeadState:
            if dst is src:
                continue
            moves = [*steps, dst.value]
            sql = "; ".join(f"UPDATE {s}.leads SET state = '{m}'" for m in moves)
            # uncertain -> failed_safe also needs a recorded decision (test_operators)
            if dst in TRANSITIONS[src] and (src, dst) != (LeadState.UNCERTAIN,
                                                         LeadState.FAILED_SAFE):
                pg.execute(f"BEGIN; {sql}; ROLLBACK")
            else:
                with pytest.raises(asyncpg.PostgresError):
                    pg.execute(f"BEGIN; {sql}; ROLLBACK")


async def test_tasks_sharing_one_store_never_interleave_transactions(
    store: Store, scope: Scope
) -> None:
    """A status read (one read transaction) while other tasks of the same process accept:
    the accepts wait for the read instead of running inside it, and none is lost."""
    import anyio

    seen: list[int] = []
    reading = anyio.Event()

    async def read() -> None:
        async with store.reading():
            seen.append((await store.summary()).counts[LeadState.PREPARED])
            reading.set()
            await anyio.sleep(0.05)  # let the accepting tasks try to cut in
            seen.append(len([r async for r in store.iter_records()]))

    async def accept_later(i: int) -> None:
        await reading.wait()
        await accept(store, scope, i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        for i in range(10):
            tg.start_soon(accept_later, i)
    assert seen[0] == seen[1]  # one snapshot
    doc = await status_document(store)
    assert doc["counts"]["prepared"] == 10 and doc["outbox"]["count"] == 10


# -- the batch step of dispatch (issue 16) --------------------------------------------


async def test_a_batch_step_records_outcomes_and_marks_the_next_batch_in_one_commit(
    store: Store, scope: Scope
) -> None:
    for i in range(5):
        await accept(store, scope, i)
    ids = [WriteId(f"w-{i}") for i in range(5)]
    assert await store.finish_and_mark_batch([], ids[:3], NOW) == {w: 1 for w in ids[:3]}
    marked = await store.finish_and_mark_batch(
        [(ids[0], LeadState.CONFIRMED), (ids[1], LeadState.UNCERTAIN),
         (ids[2], LeadState.FAILED_SAFE)], ids[3:], NOW)
    assert marked == {ids[3]: 1, ids[4]: 1}
    again = await store.finish_and_mark_batch(
        [(ids[3], LeadState.CONFIRMED), (ids[4], LeadState.CONFIRMED)], [ids[2], ids[0]], NOW)
    assert again == {ids[2]: 2}  # failed_safe is sent again (attempts + 1); w-0 is not
    states = {r.write_id: r.state async for r in store.iter_records()}
    assert states == {ids[0]: LeadState.CONFIRMED, ids[1]: LeadState.UNCERTAIN,
                      ids[2]: LeadState.IN_FLIGHT, ids[3]: LeadState.CONFIRMED,
                      ids[4]: LeadState.CONFIRMED}
    assert await store.uncertain_count() == 1
    summary = await store.summary()
    assert summary.outbox_by_kind == {"accepted": 5, "state_changed": 11}


async def test_a_batch_step_refuses_an_outcome_of_a_record_not_in_flight(
    store: Store, scope: Scope
) -> None:
    from runner.leads.states import IllegalTransition

    await accept(store, scope, 1)
    with pytest.raises(IllegalTransition):
        await store.finish_and_mark_batch([(WriteId("w-1"), LeadState.CONFIRMED)], [], NOW)
    with pytest.raises(IllegalTransition):  # not an outcome of a send
        await store.finish_and_mark_batch([(WriteId("w-1"), LeadState.PREPARED)], [], NOW)
    assert await store.uncertain_count() == 0


async def test_the_dispatch_runs_blocking_steps_answer_as_the_batch_step_does(
    store: Store, scope: Scope
) -> None:
    """``dispatch_steps()`` (a dispatch run's steps, called from its worker thread; on
    SQLite a connection of their own): the same marks, attempts, refusals and events as
    the batch step above; a refused ``mark_batch`` keeps nothing of its transaction."""
    import anyio

    from runner.leads.states import IllegalTransition

    for i in range(6):
        await accept(store, scope, i)
    ids = [WriteId(f"w-{i}") for i in range(6)]
    async with store.dispatch_steps() as steps:
        def run(call: object, *args: object) -> object:
            return anyio.to_thread.run_sync(lambda: call(*args))  # type: ignore[operator]

        assert await run(steps.finish_and_mark_batch, [], ids[:3], NOW) == {
            w: 1 for w in ids[:3]}
        marked, seq = await run(steps.mark_batch,  # type: ignore[misc]
                                [(ids[0], LeadState.CONFIRMED), (ids[1], LeadState.UNCERTAIN),
                                 (ids[2], LeadState.FAILED_SAFE)], ids[3:5], NOW)
        assert marked == {ids[3]: 1, ids[4]: 1} and seq > 0
        # w-2 failed_safe goes again (attempts + 1), w-0 confirmed is skipped, w-9 unknown
        assert await run(steps.finish_and_mark_batch,
                         [(ids[3], LeadState.CONFIRMED), (ids[4], LeadState.CONFIRMED)],
                         [ids[2], ids[0], WriteId("w-9")], NOW) == {ids[2]: 2}
        before = {r.write_id: r.state async for r in store.iter_records()}
        with pytest.raises(IllegalTransition):  # w-0 is not in flight
            await run(steps.mark_batch, [(ids[0], LeadState.CONFIRMED)], [ids[5]], NOW)
    records = {r.write_id: r async for r in store.iter_records()}
    states = {w: r.state for w, r in records.items()}
    summary = await store.summary()
    if store.backend == "sqlite":  # one transaction: nothing kept
        assert states == before
        assert summary.outbox_by_kind == {"accepted": 6, "state_changed": 11}
    else:  # the step apart (PostgreSQL): the mark beside the refused outcome committed,
        # and nothing was sent, so it is recorded "not sent", due at once
        assert states == {**before, ids[5]: LeadState.FAILED_SAFE}
        assert (records[ids[5]].last_failure, records[ids[5]].attempts) == ("not_sent", 1)
        assert summary.outbox_by_kind == {"accepted": 6, "state_changed": 13}
    assert before == {ids[0]: LeadState.CONFIRMED, ids[1]: LeadState.UNCERTAIN,
                      ids[2]: LeadState.IN_FLIGHT, ids[3]: LeadState.CONFIRMED,
                      ids[4]: LeadState.CONFIRMED, ids[5]: LeadState.PREPARED}


# -- the reason of a rejected write (issue 17, v13) ------------------------------------


async def test_a_failed_safe_outcome_keeps_its_reason_bounded_until_the_next_change(
    store: Store, scope: Scope
) -> None:
    from runner.limits import MAX_LAST_ERROR

    for i in range(3):
        await accept(store, scope, i)
    ids = [WriteId(f"w-{i}") for i in range(3)]
    await store.finish_and_mark_batch([], ids[:2], NOW)
    long_reason = "the target rejected the request (422):\n\tfield x " + "y" * 1000
    await store.finish_and_mark_batch(
        [(ids[0], LeadState.FAILED_SAFE), (ids[1], LeadState.CONFIRMED)], [ids[2]], NOW,
        NOW, long_reason)
    await store.finish_send(ids[2], LeadState.FAILED_SAFE, NOW, NOW)  # no reason given
    errors = {r.write_id: r.last_error async for r in store.iter_records()}
    kept = errors[ids[0]]
    assert kept is not None and len(kept) == MAX_LAST_ERROR and kept.endswith("…")
    assert kept.startswith("the target rejected the request (422): field x yyy")
    assert errors[ids[1]] is None and errors[ids[2]] is None  # confirmed; no reason
    assert (await store.summary()).retries["rejected"] == 1
    listed = [r async for r in iter_record_json(store)]
    assert [r["last_error"] for r in listed] == [kept, None, None]
    # the next state change clears it: sent again (in flight), then a single-step outcome
    assert await store.finish_and_mark(None, ids[0], NOW) == 2
    assert {r.write_id: r.last_error async for r in store.iter_records()}[ids[0]] is None
    await store.finish_send(ids[0], LeadState.FAILED_SAFE, NOW, NOW, "rejected again")
    assert (await store.summary()).retries["rejected"] == 1
    found = {r.write_id: r.last_error async for r in store.iter_records()}
    assert found[ids[0]] == "rejected again"
