"""SQLite's steps of staged processing (``runner.io.engine.pipeline``).

A claim is one ``BEGIN IMMEDIATE`` transaction: take a new fencing token from
``pipeline_fence``, mark up to ``limit`` claimable rows with it, read them back with their
inputs.  The write lock of ``BEGIN IMMEDIATE`` is what keeps two claimers off the same
rows, and what keeps record writers out of a registration or a merge: SQLite needs none
of PostgreSQL's locks.  SQLite has no notifications: a consumer simply polls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from runner.io.engine.base import Row
from runner.io.sqlite.base import SQLiteBase
from runner.pipeline.model import Stage, canonical

if TYPE_CHECKING:
    from runner.pipeline.model import NewRecord


class PollWakeups:
    """Wake-ups by polling only (``runner.pipeline.port.Wakeups``)."""

    async def wait(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class PipelineHooks(SQLiteBase):
    async def _claim_rows(self, params: Mapping[str, Any]) -> tuple[int, Sequence[Row]]:
        async with self.transaction():
            token = int((await self.fetch("_next_pipeline_fence"))[0][0])
            taken = await self.fetch("_claim_pipeline_work", token=token, **params)
            rows = await self.fetch("_claimed_pipeline_items", token=token) if taken else []
        return token, rows

    async def _hold_record_writers(self) -> None:
        pass  # BEGIN IMMEDIATE holds them off already

    async def _hold_pipeline_writers(self) -> None:
        pass  # BEGIN IMMEDIATE holds them off already

    async def _lock_merge_keys(self, level: int, keys: Sequence[str]) -> None:
        pass  # BEGIN IMMEDIATE: one merge at a time

    async def _replace_records(self, rows: Sequence[Mapping[str, Any]], **common: Any
                               ) -> None:
        await self.execute_many("replace_pipeline_records",
                                [{**common, **row} for row in rows])

    async def _ingest_records(self, records: Sequence[NewRecord], **common: Any) -> int:
        return await self.execute("_ingest_pipeline_records", **common, rows=[
            [r.key, canonical(r.payload)] for r in records])

    @asynccontextmanager
    async def wakeups(self, stage: Stage) -> AsyncIterator[PollWakeups]:
        yield PollWakeups()
