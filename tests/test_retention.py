"""Outbox retention (issue 15 point 11, ``runner.retention``): export with a watermark, a
prune bounded by the watermark, the raw retriever and the newest event, readers below the
floor refused, counts after a prune.  In process, on both backends."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from runner.cli import main
from runner.clock import SystemClock
from runner.errors import OutboxPruned
from runner.io.postgres import outbox_schema as pg_outbox_schema
from runner.io.postgres import schema as pg_schema
from runner.io.sqlite import schema as sqlite_schema
from runner.io.stores import open_store
from runner.leads.intake import prepare
from runner.leads.models import Scope, WriteId
from runner.pipeline.engine import RoundResult
from runner.pipeline.stages import raw_ingestion
from runner.pipeline.workers import WorkerCycle
from runner.retention import PruneFacts, plan_prune
from runner.store import Store
from runner.tasks.pipeline import CycleLog
from tests.helpers import SCOPE, event

NOW = "2026-11-30T12:00:00Z"


async def _fill(location: str, n: int, *, ingest: bool) -> None:
    from datetime import UTC, datetime

    scope = Scope.model_validate(SCOPE)
    async with await open_store(location, scope=scope) as store:
        for i in range(n):
            ev, text = prepare(event(i), scope)
            await store.accept(ev, text, WriteId(f"w-{i}"), datetime.now(UTC))
        if ingest:
            settings = raw_ingestion.IngestSettings(batch_size=1000)
            await raw_ingestion.run_cycle(store, settings, SystemClock())


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _json(out: str) -> dict[str, object]:
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_schemas_name_the_retrievers_cursor() -> None:
    assert sqlite_schema.RETRIEVER_CURSOR == raw_ingestion.CURSOR
    assert pg_outbox_schema.RETRIEVER_CURSOR == raw_ingestion.CURSOR
    assert max(sqlite_schema.MIGRATIONS) == max(pg_schema.MIGRATIONS) >= 7  # retention is v7


def test_plan_takes_the_lowest_bound() -> None:
    facts = PruneFacts(floor=0, export_watermark=None, retriever_cursor=10,
                       first_uningested=None, last_seq=20)
    assert plan_prune(6, facts).floor == 5
    assert plan_prune(6, facts).limited_by == "requested"
    assert plan_prune(100, facts).limited_by == "raw_retriever"
    with_mark = PruneFacts(0, 3, 10, None, 20)
    assert (plan_prune(100, with_mark).floor, plan_prune(100, with_mark).limited_by) == (
        3, "export_watermark")
    gap = PruneFacts(0, None, 10, 4, 20)  # event 4 skipped by the retriever, not in D1
    assert plan_prune(100, gap).floor == 3
    newest = PruneFacts(0, None, 20, None, 20)
    assert (plan_prune(100, newest).floor, plan_prune(100, newest).limited_by) == (
        19, "newest_event")
    assert plan_prune(1, PruneFacts(7, None, 20, None, 30)).floor == 7  # never moves down


def test_a_store_whose_pipeline_never_ran_keeps_its_outbox(
    db_location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_fill(db_location, 5, ingest=False))
    code, out, _ = _cli(capsys, "outbox", "prune", "--db", db_location, "--before", "100")
    assert code == 0
    assert _json(out) == {"pruned": 0, "floor": 0, "previous_floor": 0,
                          "limited_by": "raw_retriever", "by_kind": {}}


def test_export_prune_and_read_after_the_floor(
    db_location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_fill(db_location, 10, ingest=True))
    code, out, _ = _cli(capsys, "outbox", "export", "--db", db_location, "--after", "0",
                        "--limit", "4", "--commit-watermark")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in lines] == [1, 2, 3, 4]
    assert lines[0]["kind"] == "accepted" and lines[0]["subject"] == "lead-0"
    assert "contact_alias" not in json.dumps(lines)

    # the export watermark (4) bounds the prune, not the request
    code, out, _ = _cli(capsys, "outbox", "prune", "--db", db_location, "--before", "9")
    assert code == 0
    assert _json(out) == {"pruned": 4, "floor": 4, "previous_floor": 0,
                          "limited_by": "export_watermark", "by_kind": {"accepted": 4}}

    # reading on from the floor: every later event, no gap
    code, out, _ = _cli(capsys, "outbox", "export", "--db", db_location, "--after", "4")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(5, 11))
    # from below the floor: a clear error, no event printed (only the refusal's line)
    code, out, err = _cli(capsys, "outbox", "export", "--db", db_location, "--after", "2")
    assert (code, out) == (65, '{"result":"refused","reason":"pruned"}\n')
    assert "pruned through seq 4" in err

    code, out, _ = _cli(capsys, "status", "--db", db_location)
    outbox = json.loads(out)["outbox"]
    assert outbox == {"count": 6, "last_seq": 10, "by_kind": {"accepted": 6},
                      "pruned": {"floor": 4, "count": 4, "by_kind": {"accepted": 4}}}

    code, out, _ = _cli(capsys, "outbox", "watermark", "--db", db_location)
    assert _json(out) == {"floor": 4, "export_watermark": 4, "pruned": 4,
                          "pruned_by_kind": {"accepted": 4}}


async def test_readers_below_the_floor_are_refused_and_the_sequence_goes_on(
    db_location: str
) -> None:
    await _fill(db_location, 6, ingest=True)
    scope = Scope.model_validate(SCOPE)
    async with await open_store(db_location, scope=scope) as store:
        result = await store.prune_outbox(100, raw_ingestion.LEAD_KINDS, NOW)
        assert (result.pruned, result.floor, result.limited_by) == (5, 5, "newest_event")
        with pytest.raises(OutboxPruned):
            await store.read_outbox(0, 10)
        assert [e.seq for e in await store.read_outbox(5, 10)] == [6]
        # the newest event was kept, so the next one is 7 on both backends
        from datetime import UTC, datetime

        ev, text = prepare(event("next"), scope)
        await store.accept(ev, text, WriteId("w-next"), datetime.now(UTC))
        assert [e.seq for e in await store.read_outbox(5, 10)] == [6, 7]
        # the retriever goes on from its cursor as before
        got = await raw_ingestion.run_cycle(store, raw_ingestion.IngestSettings(),
                                            SystemClock())
        assert got.outcomes["ingested"] == 1
        # a backfill from below the floor is refused, not shortened
        with pytest.raises(OutboxPruned):
            await raw_ingestion.backfill(store, raw_ingestion.IngestSettings(), SystemClock(),
                                         from_seq=0, to_seq=7, on_batch=lambda *_: None)


async def test_the_watermark_only_moves_forward(store: Store, scope: Scope) -> None:
    from datetime import UTC, datetime

    for i in range(3):
        ev, text = prepare(event(i), scope)
        await store.accept(ev, text, WriteId(f"w-{i}"), datetime.now(UTC))
    assert await store.set_export_watermark(2, NOW) == 2
    assert await store.set_export_watermark(1, NOW) == 2
    assert (await store.retention_state()).export_watermark == 2


def test_the_sqlite_schema_refuses_a_delete_above_the_floor(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(workdir / "q.db")
    asyncio.run(_fill(db, 5, ingest=True))
    assert _cli(capsys, "outbox", "prune", "--db", db, "--before", "3")[0] == 0
    conn = sqlite3.connect(db)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only above its prune floor"):
            conn.execute("DELETE FROM outbox WHERE seq = 3")
        with pytest.raises(sqlite3.IntegrityError, match="only moves up"):
            conn.execute("UPDATE outbox_retention SET floor = 1")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE outbox SET kind = 'x' WHERE seq = 4")
        with pytest.raises(sqlite3.IntegrityError, match="newest event"):
            conn.execute("UPDATE outbox_retention SET floor = 5")
    finally:
        conn.close()


def _cycle(claimed: int) -> WorkerCycle:
    return WorkerCycle("core-processor", 1, RoundResult(claimed=claimed))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_idle_cycles_log_at_debug_and_busy_ones_at_a_bounded_rate() -> None:
    logger = logging.getLogger("runner.pipeline")
    seen = _Records()
    logger.addHandler(seen)
    before = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        log = CycleLog("core-processor", every=3600)
        for _ in range(50):
            log(_cycle(0))
            log(_cycle(2))
        assert [r for r in seen.records if r.levelno >= logging.INFO] == []
        assert sum(1 for r in seen.records if r.getMessage().endswith("0 claimed")) == 50
        log.since -= 3600
        log(_cycle(1))
        infos = [r for r in seen.records if r.levelno >= logging.INFO]
        assert [getattr(r, "action", None) for r in infos] == ["pipeline.progress"]
        assert getattr(infos[0], "count", None) == 101
        log.since -= 3600
        log(_cycle(0))  # an idle period: no info line
        assert len([r for r in seen.records if r.levelno >= logging.INFO]) == 1
    finally:
        logger.removeHandler(seen)
        logger.setLevel(before)
