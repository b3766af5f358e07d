"""SQLite's hooks for the lead operations (``runner.io.engine``): the bulk accept's insert
that learns the new keys, and the poll-health lock (none needed).

A group is one multi-row ``INSERT … VALUES`` per 5,000 records (6 parameters each, under
SQLite's 32,766 limit), its outbox rows written by a trigger: one awaited call (and one
commit) for a group of that size.  SQLite applies the VALUES rows in order, so a key that
appears twice in a group is inserted once, first.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import lru_cache
from itertools import chain
from typing import TYPE_CHECKING, Any

import anyio

from runner.io.engine.base import Row
from runner.io.sqlite.base import QUERIES, SQLiteBase

if TYPE_CHECKING:
    from runner.storedata import AcceptItem

#: groups up to this size learn their new keys from RETURNING; larger ones from changes()
RETURNING_ROWS = 32
#: rows per INSERT statement
CHUNK = 5000
_VALUES_ROW = re.compile(r"VALUES\s*(\([?,\s]*\))")


@lru_cache(maxsize=64)
def _repeated(name: str, rows: int) -> str:
    """The named statement with its one ``VALUES (?, …)`` row written ``rows`` times."""
    sql = QUERIES[name].sql
    match = _VALUES_ROW.search(sql)
    if match is None:
        raise ValueError(f"query {name!r} has no VALUES row of ? placeholders")
    return sql[:match.start(1)] + ",".join([match.group(1)] * rows) + sql[match.end(1):]


class LeadHooks(SQLiteBase):
    async def fetch_values(self, name: str, rows: Sequence[Sequence[Any]]) -> Sequence[Row]:
        """Run a named ``INSERT … VALUES (?, …)`` once for all ``rows`` (one statement)."""
        async with self._guard():
            return await self._fetchall(_repeated(name, len(rows)),
                                        list(chain.from_iterable(rows)))

    @asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        """The connection for several statements that are not one transaction (a read of
        ``changes()`` must follow its insert with no other statement between)."""
        async with self._guard():
            owner, self._owner = self._owner, anyio.get_current_task().id
            try:
                yield
            finally:
                self._owner = owner

    async def _insert_new(self, items: Sequence[AcceptItem], at: str) -> set[str]:
        if len(items) <= RETURNING_ROWS:  # one statement: its own transaction, one call
            return await self._insert_chunk(items, at)
        chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        inserted: set[str] = set()
        if len(chunks) == 1:  # its changes() read follows it with no statement between
            async with self._held():
                return await self._insert_chunk(chunks[0], at)
        async with self.transaction():
            for chunk in chunks:
                inserted |= await self._insert_chunk(chunk, at)
        return inserted

    async def _insert_chunk(self, chunk: Sequence[AcceptItem], at: str) -> set[str]:
        """Insert a chunk; the write_ids that were inserted (the new keys).

        A small group reads them from ``RETURNING``.  A large one asks ``changes()``
        instead: fetching a thousand ``RETURNING`` rows takes the GIL back once per row,
        and with the next group being validated on the event loop meanwhile, each of those
        waits can last a GIL switch interval.  The write_ids are fresh, so when every row
        went in, they are all new; otherwise the few that did are looked up.
        """
        rows = [(it.event.tenant_id, it.event.source_lead_id, it.canonical, it.write_id,
                 at, at) for it in chunk]
        if len(chunk) <= RETURNING_ROWS:
            return {str(r[0]) for r in await self.fetch_values("_insert_leads_returning", rows)}
        await self.fetch_values("_insert_leads", rows)
        ((count,),) = await self.fetch("_changes")
        ids = [it.write_id for it in chunk]
        if count == len(chunk):
            return set(ids)
        return {str(r[0]) for r in await self.fetch("_inserted_write_ids", write_ids=ids)}

    async def _lock_poll_health(self) -> None:
        """Nothing to take: the pass's ``BEGIN IMMEDIATE`` keeps every other writer out."""
