"""Shared helpers for the pipeline tests: real lead histories written through the store's
own operations, draining the stages, and reading the pipeline tables on either backend."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from runner.clock import Clock, FixedClock
from runner.leads.intake import prepare
from runner.leads.models import Scope, WriteId
from runner.leads.states import LeadState
from runner.pipeline.engine import Registry, WorkerSettings
from runner.pipeline.jobs import run_job
from runner.pipeline.plugins import default_registry
from runner.store import AcceptItem, ObservationWrite, Store, is_postgres
from tests.helpers import event

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
REPLAYS = ("replay-core", "replay-generic-materialization", "replay-domain-projection")


async def lead_history(store: Store, scope: Scope, n: int, *, confirm: Sequence[int] = (),
                       statuses: dict[int, str] | None = None, start: int = 0) -> None:
    """Accept leads ``start..start+n-1``; deliver those in ``confirm``; observe
    ``statuses`` (index -> status) on confirmed ones.  Every step writes its outbox
    event through the store, as the lead workload does."""
    items = []
    for i in range(start, start + n):
        ev, text = prepare(event(i), scope)
        items.append(AcceptItem(ev, text, WriteId(f"w-{i}")))
    await store.accept_many(items, NOW)
    for i in confirm:
        await store.finish_and_mark(None, WriteId(f"w-{i}"), NOW)
        await store.finish_send(WriteId(f"w-{i}"), LeadState.CONFIRMED, NOW)
    writes = [ObservationWrite(WriteId(f"w-{i}"), "changed", f'{{"status":"{status}"}}')
              for i, status in (statuses or {}).items()]
    if writes:
        await store.apply_observations(writes, NOW)


async def drain(store: Store, registry: Registry | None = None, clock: Clock | None = None,
                *, force: bool = False, batch_size: int = 100) -> list[dict[str, Any]]:
    """Backfill the outbox into D1, then run the three replays to the end."""
    registry = registry or default_registry()
    clock = clock or FixedClock(NOW)
    settings = WorkerSettings(batch_size=batch_size, poll_interval=0.01)
    results = [await run_job(store, "backfill", registry=registry, clock=clock,
                             settings=settings)]
    for name in REPLAYS:
        results.append(await run_job(store, name, registry=registry, clock=clock,
                                     settings=settings, force=force))
    return results


async def level(store: Store, n: int) -> dict[str, Any]:
    return {key: dict(payload) async for key, payload, _rev in store.iter_level(n)}


def query(location: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run SQL on the store's tables directly (to prove what no port operation shows);
    a write is committed."""
    if is_postgres(location):
        return _pg_query(location, sql, params)
    conn = sqlite3.connect(location)
    try:
        rows = [tuple(r) for r in conn.execute(sql, params)]
        conn.commit()
        return rows
    finally:
        conn.close()


PIPELINE_TABLES = ("pipeline_records", "pipeline_history", "pipeline_work",
                   "pipeline_outcome_history", "pipeline_cursors", "pipeline_worker_config",
                   "pipeline_processors")


def dump_pipeline(location: str) -> list[str]:
    """Every row of every pipeline table, as text (to look for what must not be there)."""
    out = []
    for table in PIPELINE_TABLES:
        out += [repr(row) for row in query(location, f"SELECT * FROM {table}")]
    return out


def _pg_query(location: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The same query on PostgreSQL, with the store's schema as the search path."""
    import asyncpg

    from tests import pg

    async def go() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(pg.dsn(), timeout=10,
                                     server_settings={"search_path": pg.schema_of(location)})
        try:
            return [tuple(r) for r in await conn.fetch(sql, *params)]
        finally:
            await conn.close()

    return pg.run(go)
