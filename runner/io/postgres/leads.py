"""PostgreSQL's hooks for the lead operations (``runner.io.engine``): the bulk accept's
insert that learns the new keys (one statement over arrays, so one round trip and one
commit per group), and the poll-health lock (a transaction advisory lock keyed by the
schema; a unique index keeps at most one run open whatever the code does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runner.io.postgres.base import PostgresBase
from runner.io.postgres.connection import stable_key

if TYPE_CHECKING:
    from runner.storedata import AcceptItem


class LeadHooks(PostgresBase):
    async def _insert_new(self, items: Sequence[AcceptItem], at: str) -> set[str]:
        rows = await self.fetch(
            "_insert_leads", tenant_ids=[it.event.tenant_id for it in items],
            source_lead_ids=[it.event.source_lead_id for it in items],
            canonicals=[it.canonical for it in items],
            write_ids=[it.write_id for it in items], at=at)
        return {str(r[0]) for r in rows}

    async def _lock_poll_health(self) -> None:
        await self.fetch("_lock_poll_health",
                         key=stable_key("runner.poll-health", self.location.schema))
