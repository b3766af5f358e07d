"""The staged-processing engine on every backend (issue 7 points 1, 2, 5, 8; SPEC P1-P3,
P5, P8, P11): the lead funnel end to end, outcomes, idempotent persistence, version
bumps, normal and force replay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runner.clock import FixedClock
from runner.leads.models import Scope
from runner.pipeline.engine import (
    Registry,
    RetryPolicy,
    WorkerSettings,
    processor,
    run_round,
)
from runner.pipeline.jobs import run_job
from runner.pipeline.model import (
    Item,
    Outcome,
    Output,
    Stage,
    failed,
    no_output,
    not_applicable,
    output,
    unsupported,
)
from runner.pipeline.plugins import default_registry
from runner.pipeline.report import backlog_document, builtin_refs
from runner.status import status_document
from runner.store import Store
from tests.pipeline_fixtures import NOW, drain, lead_history, level, query

pytestmark = pytest.mark.timeout(60)
CLOCK = FixedClock(NOW)


async def test_the_lead_funnel_end_to_end(store: Store, scope: Scope) -> None:
    await lead_history(store, scope, 5, confirm=[0, 1, 2, 3],
                       statuses={0: "qualified", 1: "won", 2: "qualified"})
    await drain(store)
    d3 = await level(store, 3)
    assert set(d3) == {f"lead:{scope.tenant_id}:lead-{i}" for i in range(5)}
    assert d3[f"lead:{scope.tenant_id}:lead-4"]["delivery_state"] == "prepared"
    assert d3[f"lead:{scope.tenant_id}:lead-1"]["status"] == "won"
    # four confirmed leads; the one without an observed status is "new"
    assert await store.funnel() == {scope.form_id: {"new": 1, "qualified": 2, "won": 1}}
    doc = await status_document(store)
    assert doc["funnel"] == {scope.form_id: {"new": 1, "qualified": 2, "won": 1}}
    assert doc["pipeline"]["backlog"]["pending_total"] == 0
    assert doc["pipeline"]["levels"]["D4"] == 4
    # pipeline bookkeeping wrote no outbox event
    assert set(doc["outbox"]["by_kind"]) == {"accepted", "state_changed", "status_changed"}


async def test_facts_landing_out_of_order_give_the_same_current_row(
    store: Store, scope: Scope
) -> None:
    """The materializer merges by outbox sequence: processing D2 in reverse order (batch
    of 1, newest claimed first is not guaranteed, so run it twice over) changes nothing."""
    await lead_history(store, scope, 2, confirm=[0, 1], statuses={0: "won"})
    await drain(store, batch_size=1)
    first = await level(store, 3)
    await lead_history(store, scope, 0, statuses={0: "lost"})
    await drain(store, batch_size=3)
    after = await level(store, 3)
    assert after[f"lead:{scope.tenant_id}:lead-0"]["status"] == "lost"
    assert after[f"lead:{scope.tenant_id}:lead-1"] == first[f"lead:{scope.tenant_id}:lead-1"]
    assert await store.funnel() == {scope.form_id: {"lost": 1, "new": 1}}


async def test_a_redo_writes_the_same_rows_never_a_second_copy(
    store: Store, scope: Scope
) -> None:
    await lead_history(store, scope, 3, confirm=[0, 1], statuses={1: "won"})
    await drain(store)
    before = [await level(store, n) for n in (1, 2, 3, 4)]
    counts = await store.level_counts()
    await drain(store, force=True)  # every input processed again
    assert [await level(store, n) for n in (1, 2, 3, 4)] == before
    again = await store.level_counts()
    assert again.records == counts.records
    assert again.history == 0  # nothing was replaced: same payloads, same bytes


def _kinds_registry(calls: list[str]) -> Registry:
    def decide(item: Item) -> Outcome:
        calls.append(item.key)
        seq = int(item.payload["seq"])
        return [output(Output(f"echo:{seq}", {"seq": seq})), no_output(), not_applicable(),
                unsupported(), failed("permanent", retryable=False)][seq % 5]

    registry = Registry()
    registry.register(processor("kinds", version=1, stage=Stage.CORE_PROCESSING,
                                capability="test")(decide))
    return registry


async def test_every_outcome_is_terminal_and_durable(
    store: Store, scope: Scope, db_location: str
) -> None:
    await lead_history(store, scope, 10)  # outbox seq 1..10, all "accepted"
    calls: list[str] = []
    registry = _kinds_registry(calls)
    await drain(store, registry)
    assert sorted(calls) == sorted(f"outbox:{i}" for i in range(1, 11))
    rows = query(db_location, "SELECT outcome, state, count(*) FROM pipeline_work "
                              "WHERE processor = 'kinds' GROUP BY outcome, state")
    assert sorted(rows) == [("failed", "done", 2), ("no_output", "done", 2),
                            ("not_applicable", "done", 2), ("output", "done", 2),
                            ("unsupported", "done", 2)]
    doc = await backlog_document(store, registry.refs())
    assert doc["stages"]["core_processing"] == {"kinds@1": 0}
    await drain(store, registry)  # terminal inputs are not pending, whatever their output
    assert len(calls) == 10


async def test_a_retryable_failure_backs_off_then_becomes_final(
    store: Store, scope: Scope, db_location: str
) -> None:
    await lead_history(store, scope, 1)
    registry = Registry()
    attempts: list[int] = []

    @processor("flaky", version=1, stage=Stage.CORE_PROCESSING, capability="test")
    def flaky(item: Item) -> Outcome:
        attempts.append(item.attempts)
        raise RuntimeError("upstream hiccup")

    registry.register(flaky)
    await run_job(store, "backfill", registry=registry, clock=CLOCK)
    settings = WorkerSettings(poll_interval=0.01,
                              retry=RetryPolicy(max_attempts=3, backoff_seconds=0))
    result = await run_job(store, "replay-core", registry=registry, clock=CLOCK,
                           settings=settings)
    assert attempts == [1, 2, 3]
    assert result["outcomes"] == {"failed": 3}
    rows = query(db_location, "SELECT state, outcome, error, retryable, attempts "
                              "FROM pipeline_work WHERE processor = 'flaky'")
    assert rows == [("done", "failed", "RuntimeError: upstream hiccup", 1, 3)]
    history = query(db_location, "SELECT outcome FROM pipeline_outcome_history")
    assert history == [("failed",), ("failed",)]  # the earlier attempts, kept


async def test_outputs_and_outcome_commit_together(
    store: Store, scope: Scope, db_location: str
) -> None:
    """An output that cannot be stored rolls back the whole completion: no output, no
    outcome; the input stays in the backlog."""
    await lead_history(store, scope, 2)
    registry = Registry()

    @processor("bad", version=1, stage=Stage.CORE_PROCESSING, capability="test")
    def bad(item: Item) -> Outcome:
        return output(Output(f"x:{item.key}", {"n": float("nan")}))  # not JSON

    registry.register(bad)
    await run_job(store, "backfill", registry=registry, clock=CLOCK)
    await store.register_processors([bad.ref], 0)
    with pytest.raises(ValueError, match="JSON"):
        await run_round(store, bad, "test-owner", WorkerSettings(), CLOCK)
    assert await level(store, 2) == {}
    assert query(db_location, "SELECT count(*) FROM pipeline_work WHERE outcome IS NOT NULL"
                 ) == [(0,)]
    assert (await backlog_document(store, [bad.ref]))["stages"]["core_processing"] == {
        "bad@1": 2}


def _versioned(version: int, seen: list[tuple[int, str]], *, rebacklog: bool = True,
               value: Callable[[int], str] = str) -> Registry:
    @processor("tagger", version=version, stage=Stage.CORE_PROCESSING, capability="tag",
               rebacklog_on_version_bump=rebacklog)
    def tag(item: Item) -> Outcome:
        seen.append((version, item.key))
        return output(Output(f"tag:{item.key}", {"tag": value(version)}))

    registry = Registry()
    registry.register(tag)
    return registry


async def test_a_version_bump_puts_terminal_inputs_back_in_the_backlog(
    store: Store, scope: Scope
) -> None:
    await lead_history(store, scope, 3)
    seen: list[tuple[int, str]] = []
    await drain(store, _versioned(1, seen))
    v2 = _versioned(2, seen)
    doc = await backlog_document(store, v2.refs())
    assert doc["stages"]["core_processing"] == {"tagger@2": 3}
    assert doc["pending_total"] == 3
    await drain(store, v2)
    assert sorted(v for v, _ in seen) == [1, 1, 1, 2, 2, 2]
    assert {p["tag"] for p in (await level(store, 2)).values()} == {"2"}


async def test_a_processor_may_declare_a_version_bump_does_not_rebacklog(
    store: Store, scope: Scope
) -> None:
    await lead_history(store, scope, 3)
    seen: list[tuple[int, str]] = []
    await drain(store, _versioned(1, seen, rebacklog=False))
    v2 = _versioned(2, seen, rebacklog=False)
    assert (await backlog_document(store, v2.refs()))["pending_total"] == 0
    await lead_history(store, scope, 1, start=3)  # a new input: v2's work
    await run_job(store, "backfill", registry=v2, clock=CLOCK)
    assert (await backlog_document(store, v2.refs()))["stages"]["core_processing"] == {
        "tagger@2": 1}
    await drain(store, v2)
    assert [v for v, _ in seen] == [1, 1, 1, 2]


async def test_normal_replay_resumes_force_replay_recomputes_and_keeps_history(
    store: Store, scope: Scope, db_location: str
) -> None:
    await lead_history(store, scope, 2)
    seen: list[tuple[int, str]] = []
    await drain(store, _versioned(1, seen, value=lambda v: "old"))
    normal = _versioned(1, seen, value=lambda v: "new")
    result = await run_job(store, "replay-core", registry=normal, clock=CLOCK)
    assert result["processed"] == 0 and len(seen) == 2  # nothing pending: nothing redone
    assert {p["tag"] for p in (await level(store, 2)).values()} == {"old"}

    forced = await run_job(store, "replay-core", registry=normal, clock=CLOCK, force=True)
    assert forced["processed"] == 2 and forced["requeued"] == 2
    assert {p["tag"] for p in (await level(store, 2)).values()} == {"new"}
    history = query(db_location,
                    "SELECT h.payload, h.processor, h.version, h.input_id IS NOT NULL "
                    "FROM pipeline_history h JOIN pipeline_records r ON r.id = h.record_id "
                    "WHERE r.level = 2 ORDER BY h.id")
    assert history == [('{"tag":"old"}', "tagger", 1, 1)] * 2  # with its provenance
    outcomes = query(db_location, "SELECT outcome, processor, version "
                                  "FROM pipeline_outcome_history")
    assert outcomes == [("output", "tagger", 1)] * 2


async def test_status_counts_the_builtin_backlog_before_any_worker_ran(
    store: Store, scope: Scope
) -> None:
    await lead_history(store, scope, 4, confirm=[0])
    doc = await backlog_document(store, builtin_refs())
    assert doc == {"pending_total": 6, "stages": {
        "raw_ingestion": {"lead-outbox@1": 6}, "core_processing": {"lead-facts@1": 0},
        "generic_materialization": {"lead-current@1": 0},
        "domain_projection": {"lead-funnel@1": 0}}}
    await run_job(store, "backfill", registry=default_registry(), clock=CLOCK)
    doc = await backlog_document(store, builtin_refs())
    assert doc["stages"]["core_processing"] == {"lead-facts@1": 6}
    assert doc["stages"]["raw_ingestion"] == {"lead-outbox@1": 0}


async def test_the_schema_keeps_records_outcomes_and_history(
    store: Store, scope: Scope, db_location: str
) -> None:
    await lead_history(store, scope, 2)
    seen: list[tuple[int, str]] = []
    await drain(store, _versioned(1, seen, value=lambda v: "old"))
    await run_job(store, "replay-core", registry=_versioned(1, seen, value=lambda v: "new"),
                  clock=CLOCK, force=True)
    # histories never change; from v10 they may lose rows, which only ``pipeline prune``
    # does (tests/test_pipeline_retention.py), and a kept record keeps its outcomes
    for sql in ("DELETE FROM pipeline_records", "DELETE FROM pipeline_work",
                "UPDATE pipeline_history SET payload = '{}'",
                "UPDATE pipeline_outcome_history SET outcome = 'failed'",
                "UPDATE pipeline_records SET key = 'other' WHERE level = 2",
                "UPDATE pipeline_work SET state = 'bogus'"):
        with pytest.raises(Exception, match=r"(?i)never|constraint|check|kept"):
            query(db_location, sql)
    assert len(query(db_location, "SELECT id FROM pipeline_history")) == 2
    # pipeline bookkeeping wrote no outbox event
    assert query(db_location, "SELECT DISTINCT kind FROM outbox ORDER BY kind") == [
        ("accepted",)]


async def test_the_retriever_closes_gaps_its_hot_config_left_behind_the_cursor(
    store: Store, scope: Scope, tmp_path: Path
) -> None:
    import json as _json

    from runner.pipeline.hotconfig import HotConfig, RetrieverConfig
    from runner.pipeline.stages import raw_ingestion
    from runner.pipeline.workers import run_worker

    await lead_history(store, scope, 4, confirm=[0, 1, 2, 3])  # accepted + state changes
    config_file = tmp_path / "retriever.json"
    config_file.write_text(_json.dumps({"kinds": ["accepted"], "batch_size": 3,
                                        "poll_interval": 0.01}))
    config = HotConfig(str(config_file), RetrieverConfig())
    clock = FixedClock(NOW)

    async def cycles(n: int) -> None:
        await run_worker(store, raw_ingestion.WORKER, registry=default_registry(),
                         clock=clock, cycles=n, config=config)

    await cycles(10)  # the whole outbox read; only "accepted" events ingested
    last = await store.outbox_last_seq()
    assert await store.cursor_position(raw_ingestion.CURSOR) == last
    assert len(await level(store, 1)) == 4
    config_file.write_text(_json.dumps({"kinds": list(raw_ingestion.LEAD_KINDS),
                                        "batch_size": 3, "poll_interval": 0.01}))
    assert await store.outbox_pending(0, raw_ingestion.LEAD_KINDS) > 0  # behind the cursor
    await cycles(10)  # no backfill job: the worker itself reads what it skipped
    assert await store.outbox_pending(0, raw_ingestion.LEAD_KINDS) == 0
    assert len(await level(store, 1)) == last
    assert await store.cursor_position(raw_ingestion.CURSOR) == last
