"""The pipeline's retention (issue 15 point 11, ``runner.pipeline.retention``): ``pipeline
prune`` removes finished per-event records and old history, keeps the current records
and everything a worker still needs, and the schema refuses the rest.  Both backends."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import anyio
import pytest

from runner.cli import main
from runner.clock import FixedClock, to_text
from runner.errors import UsageError
from runner.leads.models import Scope
from runner.pipeline.engine import WorkerSettings
from runner.pipeline.jobs import run_job
from runner.pipeline.model import Stage
from runner.pipeline.plugins import default_registry
from runner.pipeline.retention import parse_cutoff
from runner.pipeline.stages import raw_ingestion
from runner.status import status_document
from runner.store import Store, is_postgres
from tests.pipeline_fixtures import NOW, REPLAYS, drain, lead_history, level, query

pytestmark = pytest.mark.timeout(90)

NOW_MS = int(NOW.timestamp() * 1000)
#: a cutoff after everything the fixtures wrote (they write at NOW)
AFTER = NOW_MS + 1
LEAD_KINDS = raw_ingestion.LEAD_KINDS


def _counts(location: str) -> dict[str, int]:
    rows = query(location, "SELECT level, count(*) FROM pipeline_records GROUP BY level")
    out = {f"D{int(level)}": int(n) for level, n in rows}
    for table in ("pipeline_work", "pipeline_history", "pipeline_outcome_history"):
        out[table] = int(query(location, f"SELECT count(*) FROM {table}")[0][0])
    return out


async def _history(store: Store, scope: Scope) -> None:
    """Five leads, four confirmed, statuses observed and changed again: D3 and D4 get
    rewritten (history) and their outcomes replaced (outcome history)."""
    await lead_history(store, scope, 5, confirm=[0, 1, 2, 3],
                       statuses={0: "qualified", 1: "won", 2: "qualified"})
    await drain(store)
    await lead_history(store, scope, 0, statuses={0: "won", 2: "lost"})
    await drain(store)


async def _catch_up(store: Store) -> list[dict[str, Any]]:
    """The raw retriever from its cursor (a backfill from 0 is refused once the outbox
    was pruned), then every later stage to the end."""
    clock = FixedClock(NOW)
    got = await raw_ingestion.run_cycle(store, raw_ingestion.IngestSettings(), clock)
    results = [{"ingested": got.outcomes.get("ingested", 0)}]
    for name in REPLAYS:
        results.append(await run_job(store, name, registry=default_registry(), clock=clock,
                                     settings=WorkerSettings(poll_interval=0.01)))
    return results


async def _prune_outbox(store: Store) -> int:
    last = await store.outbox_last_seq()
    await store.set_export_watermark(last, to_text(NOW))
    return (await store.prune_outbox(last + 1, LEAD_KINDS, to_text(NOW))).floor


async def test_prune_removes_finished_events_and_history_and_keeps_current_records(
    store: Store, scope: Scope, db_location: str
) -> None:
    await _history(store, scope)
    funnel, d3, d4 = await store.funnel(), await level(store, 3), await level(store, 4)
    before = _counts(db_location)
    assert before["pipeline_history"] > 0 and before["pipeline_outcome_history"] > 0

    # the outbox is kept: D1 stays (the retriever would ingest its events again), D2 goes
    first = await store.prune_pipeline(AFTER, to_text(NOW))
    mid = _counts(db_location)
    assert first.removed.get("D1", 0) == 0 and mid["D1"] == before["D1"]
    assert first.removed["D2"] == before["D2"] and "D2" not in mid
    assert mid["pipeline_history"] == mid["pipeline_outcome_history"] == 0

    # once the outbox is pruned, D1 goes too, but for the newest event (always kept)
    floor = await _prune_outbox(store)
    second = await store.prune_pipeline(AFTER, to_text(NOW))
    assert second.outbox_floor == floor == await store.outbox_last_seq() - 1
    after = _counts(db_location)
    assert after["D1"] == 1 and second.removed["D1"] == before["D1"] - 1
    assert query(db_location, "SELECT key FROM pipeline_records WHERE level = 1") == [
        (f"outbox:{floor + 1}",)]

    # the current records are untouched: D3, D4, the funnel, status
    assert (after["D3"], after["D4"]) == (before["D3"], before["D4"])
    assert await level(store, 3) == d3 and await level(store, 4) == d4
    assert await store.funnel() == funnel
    doc = await status_document(store)
    assert doc["funnel"] == funnel
    assert doc["pipeline"]["backlog"]["pending_total"] == 0

    # nothing comes back: the workers find no work, the outbox's events are not re-read
    results = await _catch_up(store)
    assert results[0] == {"ingested": 0}
    assert all(r.get("claimed", 0) == 0 for r in results[1:]), results
    assert _counts(db_location) == after
    assert await level(store, 3) == d3 and await store.funnel() == funnel


async def test_a_new_fact_after_a_prune_still_lands_on_the_kept_current_record(
    store: Store, scope: Scope
) -> None:
    await _history(store, scope)
    await _prune_outbox(store)
    await store.prune_pipeline(AFTER, to_text(NOW))
    await lead_history(store, scope, 0, statuses={1: "lost"})
    await _catch_up(store)
    d3 = await level(store, 3)
    row = d3[f"lead:{scope.tenant_id}:lead-1"]
    assert row["status"] == "lost" and row["delivery_state"] == "confirmed"
    assert row["form_id"] == scope.form_id  # set by an accepted fact that was pruned
    assert await store.funnel() == {scope.form_id: {"lost": 2, "new": 1, "won": 1}}


async def test_a_level_no_processor_reads_yet_is_kept_whole(
    store: Store, scope: Scope, db_location: str
) -> None:
    """Facts mapped before any materializer ever registered are not "finished": nobody
    has read them yet (the race a prune at a worker's start would otherwise lose)."""
    await lead_history(store, scope, 3, confirm=[0, 1])
    clock = FixedClock(NOW)
    await raw_ingestion.run_cycle(store, raw_ingestion.IngestSettings(), clock)
    await run_job(store, "replay-core", registry=default_registry(), clock=clock,
                  settings=WorkerSettings(poll_interval=0.01))
    assert query(db_location, "SELECT DISTINCT input_level FROM pipeline_processors") == [
        (1,)]
    await _prune_outbox(store)
    facts = len(await _level_keys(store, 2))
    result = await store.prune_pipeline(AFTER, to_text(NOW))
    assert facts > 0 and len(await _level_keys(store, 2)) == facts
    assert result.removed.get("D2", 0) == 0 and result.removed.get("D1", 0) == 0
    assert "no processor has read" in _refused(
        db_location, "DELETE FROM pipeline_records WHERE level = 2")
    await _catch_up(store)
    assert await store.funnel() == {scope.form_id: {"new": 2}}


async def test_nothing_newer_than_the_cutoff_or_unfinished_is_removed(
    store: Store, scope: Scope, db_location: str
) -> None:
    await _history(store, scope)
    await _prune_outbox(store)
    # a cutoff before everything was written removes nothing
    early = await store.prune_pipeline(NOW_MS, to_text(NOW))
    assert sum(early.removed.values()) == 0

    # new work: lead 4 gets confirmed; ingest and map it, then claim its facts under
    # the materializer and hold the claim (a worker mid-batch)
    await lead_history(store, scope, 0, confirm=[4])
    clock = FixedClock(NOW)
    registry = default_registry()
    await raw_ingestion.run_cycle(store, raw_ingestion.IngestSettings(), clock)
    await run_job(store, "replay-core", registry=registry, clock=clock,
                  settings=WorkerSettings(poll_interval=0.01))
    generic = [r for r in registry.refs() if r.stage is Stage.GENERIC_MATERIALIZATION]
    claim = await store.claim(generic[0], "w-held", 100, 60_000, NOW_MS)
    pending = {item.key for item in claim.items}
    assert pending, "lead 4's new facts are claimed"
    assert len(await _level_keys(store, 2)) > len(pending)

    # the held facts, and the D1 records they were made from, are kept; the finished
    # ones go
    await _prune_outbox(store)
    result = await store.prune_pipeline(AFTER, to_text(NOW))
    assert {k for k, _ in await _level_keys(store, 2)} == pending
    made_from = query(db_location, "SELECT count(*) FROM pipeline_records d1 "
                                   "JOIN pipeline_records d2 ON d2.input_id = d1.id "
                                   "WHERE d1.level = 1 AND d2.level = 2")
    assert int(made_from[0][0]) == len(pending)
    assert result.removed["D2"] > 0
    # the claim is intact and completes as usual
    held = query(db_location, "SELECT count(*) FROM pipeline_work WHERE state = 'claimed'")
    assert int(held[0][0]) == len(pending)
    await store.release(claim, NOW_MS)

    await _catch_up(store)
    # lead 4's facts, kept through the prune, reach the funnel
    assert await store.funnel() == {scope.form_id: {"lost": 1, "new": 2, "won": 2}}


async def _level_keys(store: Store, n: int) -> list[tuple[str, Any]]:
    return [(key, payload) async for key, payload, _rev in store.iter_level(n)]


async def test_a_dry_run_tells_exactly_what_a_prune_removes_and_removes_nothing(
    store: Store, scope: Scope, db_location: str
) -> None:
    await _history(store, scope)
    await _prune_outbox(store)
    before = _counts(db_location)
    dry = await store.prune_pipeline(AFTER, to_text(NOW), dry_run=True, batch=2)
    assert _counts(db_location) == before
    assert query(db_location, "SELECT count(*) FROM pipeline_prunes") == [(0,)]
    real = await store.prune_pipeline(AFTER, to_text(NOW), batch=2)
    assert dry.removed == real.removed and real.rounds > 2  # in rounds of 2 per level
    assert sum(real.removed.values()) > 0
    recorded: dict[str, int] = {}
    for (removed,) in query(db_location, "SELECT removed FROM pipeline_prunes"):
        for kind, n in (json.loads(removed) if isinstance(removed, str) else removed).items():
            recorded[kind] = recorded.get(kind, 0) + n
    assert recorded == {k: n for k, n in real.removed.items() if n}


def _refused(location: str, sql: str) -> str:
    """The error the store's schema raises for ``sql`` (which must fail)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - sqlite3 or asyncpg
        query(location, sql)
    return str(caught.value)


async def test_the_schema_refuses_to_remove_what_a_prune_keeps(
    store: Store, scope: Scope, db_location: str
) -> None:
    await lead_history(store, scope, 3, confirm=[0, 1])
    await drain(store)
    await lead_history(store, scope, 0, confirm=[2])
    await raw_ingestion.run_cycle(store, raw_ingestion.IngestSettings(), FixedClock(NOW))
    assert "only once done" in _refused(
        db_location, "DELETE FROM pipeline_work WHERE state <> 'done'")
    assert "D4 are kept" in _refused(db_location,
                                     "DELETE FROM pipeline_records WHERE level = 4")
    assert "D4 are kept" in _refused(db_location,
                                     "DELETE FROM pipeline_records WHERE level = 3")
    kept = "outcomes of a kept pipeline record"
    assert kept in _refused(db_location, "DELETE FROM pipeline_work WHERE input_id IN "
                                         "(SELECT id FROM pipeline_records WHERE level = 3)")
    # a D1 record whose fact and outbox event are kept: neither it nor its outcomes go
    first = int(query(db_location,
                      "SELECT min(id) FROM pipeline_records WHERE level = 1")[0][0])
    assert "with work on it" in _refused(
        db_location, f"DELETE FROM pipeline_records WHERE id = {first}")
    assert kept in _refused(db_location,
                            f"DELETE FROM pipeline_work WHERE input_id = {first}")
    assert int(query(db_location, "SELECT count(*) FROM pipeline_work "
                                  f"WHERE input_id = {first}")[0][0]) > 0
    if is_postgres(db_location):
        assert "never deleted" in _refused(db_location, "TRUNCATE pipeline_records CASCADE")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if out.strip() else None), err


def test_pipeline_prune_from_the_command_line(
    db_location: str, scope: Scope, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner.io.stores import open_store

    async def fill() -> None:
        async with await open_store(db_location, scope=scope) as store:
            await _history(store, scope)
            await _prune_outbox(store)

    asyncio.run(fill())
    before = _counts(db_location)
    later = to_text(NOW + timedelta(hours=2))
    code, dry, _ = _cli(capsys, "pipeline", "prune", "--db", db_location, "--before", "1h",
                        "--now", later, "--dry-run")
    assert code == 0 and dry["dry_run"] is True and _counts(db_location) == before
    assert dry["before"] == to_text(NOW + timedelta(hours=1))
    code, done, _ = _cli(capsys, "pipeline", "prune", "--db", db_location, "--before", "1h",
                         "--now", later)
    assert code == 0
    assert done["removed"] == dry["removed"] and done["removed"]["D2"] == before["D2"]
    assert list(done["removed"]) == ["D1", "D2", "D3", "work", "history", "outcome_history"]
    # a bad cutoff is a usage error that changes nothing
    for bad in ("7", "soon", "9999-01-01T00:00Z", "2h"):
        code, out, err = _cli(capsys, "pipeline", "prune", "--db", db_location,
                              "--before", bad, "--now", to_text(NOW))
        if bad == "2h":
            assert code == 0  # an age older than everything: nothing left to remove
            assert sum(out["removed"].values()) == 0
        else:
            assert code == 2, (bad, err)
            assert "--before" in err


def test_the_cutoff_is_an_age_or_a_past_time() -> None:
    assert parse_cutoff("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_cutoff("7d", NOW) == NOW - timedelta(days=7)
    assert parse_cutoff("1.5h", NOW) == NOW - timedelta(minutes=90)
    assert parse_cutoff("2026-11-30T11:00:00Z", NOW) == NOW - timedelta(hours=1)
    for bad in ("7", "-1d", "tomorrow", "2026-12-01T00:00Z", "100000000d", "2026-11-30"):
        with pytest.raises(UsageError, match="--before"):
            parse_cutoff(bad, NOW)


async def test_prunes_while_the_workers_run_keep_every_current_record_right(
    db_location: str, scope: Scope
) -> None:
    """The four workers run on connections of their own while leads arrive, statuses
    change and both prunes run between rounds: the current records end as the lead
    history says, and the per-event rows are gone."""
    import anyio

    from runner.io.stores import open_store
    from runner.pipeline.report import backlog_document
    from runner.pipeline.workers import run_worker

    names = ("raw-retriever", "core-processor", "generic-materializer", "domain-projector")
    settings = WorkerSettings(batch_size=7, poll_interval=0.01)
    clock = FixedClock(NOW)
    registry = default_registry()
    statuses = ("qualified", "won", "lost")
    expected: dict[int, str] = {}
    stores = [await open_store(db_location, scope=scope) for _ in range(6)]
    feeder, pruner, *workers = stores
    try:
        async with anyio.create_task_group() as tg:
            for store, name in zip(workers, names, strict=True):
                tg.start_soon(lambda s=store, n=name: run_worker(
                    s, n, registry=registry, clock=clock, settings=settings))
            for rnd in range(6):
                seen = {i: statuses[(i + rnd) % 3] for i in range(0, rnd * 5, 2)}
                expected.update(seen)
                await lead_history(feeder, scope, 5, start=rnd * 5,
                                   confirm=range(rnd * 5, rnd * 5 + 5), statuses=seen)
                await _prune_outbox(pruner)
                await pruner.prune_pipeline(AFTER, to_text(NOW))
            with anyio.fail_after(60):
                while (await backlog_document(pruner, registry.refs()))["pending_total"]:
                    await pruner.prune_pipeline(AFTER, to_text(NOW))
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    finally:
        for store in stores:
            await store.aclose()
    async with await open_store(db_location, scope=scope) as store:
        await _prune_outbox(store)
        await store.prune_pipeline(AFTER, to_text(NOW))
        d3 = await level(store, 3)
        assert len(d3) == 30
        for i in range(30):
            row = d3[f"lead:{scope.tenant_id}:lead-{i}"]
            assert row["delivery_state"] == "confirmed"
            assert row.get("status") == expected.get(i), i
        funnel: dict[str, int] = {}
        for i in range(30):
            funnel[expected.get(i, "new")] = funnel.get(expected.get(i, "new"), 0) + 1
        assert await store.funnel() == {scope.form_id: funnel}
        counts = (await store.level_counts()).records
        assert (counts[1], counts[2], counts[3], counts[4]) == (1, 0, 30, 30)


#: kind sets the raw backlog is counted for: the default, one kind, others, none
KIND_SETS = [LEAD_KINDS, ("accepted",), ("state_changed", "status_changed"),
             ("poll_health", "accepted"), ()]


async def _raw_backlogs(store: Store) -> list[int]:
    """The raw ingestion backlog per kind set, from the kept counts (schema v14), each
    checked against the count taken from the records (every event probed for its D1)."""
    got = []
    for kinds in KIND_SETS:
        kept = await store.raw_pending(kinds)
        assert kept == await store.outbox_pending(0, kinds), kinds
        got.append(kept)
    return got


async def test_the_raw_backlog_from_kept_counts_equals_the_count_from_the_records(
    store: Store, scope: Scope
) -> None:
    await lead_history(store, scope, 6, confirm=[0, 1, 2], statuses={0: "qualified"})
    first = await _raw_backlogs(store)
    assert first[0] == 6 + 2 * 3 + 1 and first[1] == 6 and first[4] == 0
    # a retriever tailing only ``accepted``, one small batch: part of the backlog goes
    await raw_ingestion.run_cycle(
        store, raw_ingestion.IngestSettings(batch_size=4, kinds=("accepted",)),
        FixedClock(NOW))
    partial = await _raw_backlogs(store)
    assert 0 < partial[1] < first[1] and partial[2] == first[2]
    await drain(store)  # every event ingested, the later stages run
    assert await _raw_backlogs(store) == [0] * len(KIND_SETS)
    await lead_history(store, scope, 2, start=6, statuses={1: "won"})
    assert (await _raw_backlogs(store))[1] == 2
    await drain(store)
    # the outbox pruned (its events' D1 records stay a while), then the pipeline's D1
    await _prune_outbox(store)
    assert await _raw_backlogs(store) == [0] * len(KIND_SETS)
    await store.prune_pipeline(AFTER, to_text(NOW))
    await lead_history(store, scope, 1, start=8)
    assert await _raw_backlogs(store) == [1, 1, 0, 1, 0]


async def test_kept_counts_stay_exact_under_concurrent_accepts_ingestion_and_prunes(
    db_location: str, scope: Scope
) -> None:
    """Writers, the raw retriever and outbox prunes at once, each on its own connection:
    no deadlock between the counters' locks, and the kept counts equal the rows after."""
    from runner.io.stores import open_store

    rounds = 15
    ingested = anyio.Event()  # the pruner starts once there is something it may prune

    async def writer() -> None:
        async with await open_store(db_location, scope=scope, create=False) as s:
            for r in range(rounds):
                await lead_history(s, scope, 4, start=100 + 4 * r, confirm=[100 + 4 * r])

    async def retriever() -> None:
        async with await open_store(db_location, scope=scope, create=False) as s:
            for _ in range(rounds):
                await raw_ingestion.run_cycle(
                    s, raw_ingestion.IngestSettings(batch_size=7), FixedClock(NOW))
                ingested.set()

    async def pruner() -> None:
        await ingested.wait()
        async with await open_store(db_location, scope=scope, create=False) as s:
            for _ in range(rounds):
                await _prune_outbox(s)

    async with await open_store(db_location, scope=scope, create=True) as store:
        await lead_history(store, scope, 10, confirm=[0, 1, 2])
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for task in (writer, retriever, pruner):
                    tg.start_soon(task)
        await _raw_backlogs(store)
        doc = await status_document(store)
        kinds = {str(k): int(n) for k, n in query(
            db_location, "SELECT kind, count(*) FROM outbox GROUP BY kind")}
        assert doc["outbox"]["by_kind"] == kinds
        assert doc["outbox"]["count"] == sum(kinds.values())
        assert sum(doc["counts"].values()) == 10 + 4 * rounds
        assert doc["outbox"]["pruned"]["count"] > 0  # the prunes did delete events
