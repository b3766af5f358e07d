"""The store's mark and its rewinds (SPEC E8, schema v18, issue 30), written once for both
dialects: ``runner.leads.marks`` says what a mark is, ``runner.tasks.rewind`` what a
rewind does with these operations.

``mark_batch`` is the batch step of ``finish_and_mark_batch`` plus the batch's seq, in one
transaction: for a target that keeps marks, the seq a batch carries is remembered by the
commit that marks it in flight, so a store that lost that commit (a promoted asynchronous
standby) has a lower seq than the target and its next batch is refused as stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from runner.clock import to_text
from runner.ids import WriteId, seq_of
from runner.io.engine.base import Row
from runner.io.engine.delivery import DeliveryOps, last_error
from runner.leads.states import IllegalTransition


class StoreMark(NamedTuple):
    """What the store remembers of its marks (``store_marks``).

    ``fenced``: the target's fence stands at the current epoch (raised after the rewind's
    tags committed); ``rewind``: why a rewind is pending (None: none); ``adopting``: the
    previous owner an operator adopted, until the fence raise replaces it."""

    store_id: str
    epoch: int
    counter: int
    fenced: bool
    rewind: str | None
    adopting: str | None
    #: the PostgreSQL server's timeline and replication mode at the last start under the
    #: lock (None: SQLite, or not recorded yet)
    timeline: int | None = None
    replication: str | None = None
    #: until when records accepted after a rewind are looked up by key before they are
    #: sent (text; None: no rewind yet)
    key_check_until: str | None = None

    @property
    def seq(self) -> int:
        """The seq of the last batch the store marked (of the current epoch)."""
        return seq_of(self.epoch, self.counter)


def store_mark(row: Row) -> StoreMark:
    return StoreMark(str(row[0]), int(row[1]), int(row[2]),
                     row[3] is not None and int(row[3]) == int(row[1]),
                     None if row[4] is None else str(row[4]),
                     None if row[5] is None else str(row[5]),
                     None if row[6] is None else int(row[6]),
                     None if row[7] is None else str(row[7]),
                     None if row[8] is None else str(row[8]))


class MarkOps(DeliveryOps):
    async def store_mark(self) -> StoreMark:
        return store_mark((await self.fetch("store_mark"))[0])

    async def begin_epoch(self, min_epoch: int, reason: str | None, now: datetime, *,
                          tag: bool, until: datetime | None = None) -> StoreMark:
        """A new epoch above ``min_epoch`` (the target's), its fence not raised yet; with
        ``tag``, every record the forgotten history could have sent becomes uncertain,
        tagged ``rewound`` (one transaction)."""
        at = to_text(now)
        async with self.transaction():
            if tag:
                await self.execute("rewind_mark_sendable", now=at)
                await self.execute("rewind_tag", now=at, reason=last_error(reason))
            row = (await self.fetch("begin_epoch", min_epoch=min_epoch, reason=reason,
                                    now=at, until=to_text(until or now)))[0]
        return store_mark(row)

    async def begin_fenced_epoch(self, epoch: int, reason: str | None, now: datetime, *,
                                 until: datetime) -> StoreMark:
        """The epoch whose fence the target holds now, in one transaction: the store's
        epoch (counter 0), with ``reason`` every record a forgotten history could have
        sent tagged ``rewound`` (and records sent until ``until`` looked up by key), and
        the record that the fence stands."""
        at = to_text(now)
        async with self.transaction():
            if reason is not None:
                await self.execute("rewind_mark_sendable", now=at)
                await self.execute("rewind_tag", now=at, reason=last_error(reason))
            row = (await self.fetch("begin_epoch", min_epoch=epoch - 1, reason=reason,
                                    now=at, until=to_text(until)))[0]
            mark = store_mark(row)
            if mark.epoch != epoch or not await self.fetch("fence_raised", epoch=epoch,
                                                           now=at):
                raise IllegalTransition(f"the store's epoch is {mark.epoch}, not the "
                                        f"fence's {epoch}: another worker holds the lock?")
        return mark._replace(fenced=True)

    async def key_check(self, reason: str, now: datetime) -> int:
        """Every prepared and failed_safe record becomes uncertain, tagged ``rewound``, so
        that it is read back by key before it is sent (records accepted after a rewind,
        within its key-check window); how many."""
        at = to_text(now)
        async with self.transaction():
            moved = await self.execute("rewind_mark_sendable", now=at)
            if moved:
                await self.execute("key_check_tag", now=at, reason=last_error(reason))
                await self.execute("key_check_pending", reason=reason, now=at)
        return moved

    async def rewound_page(self, after_seq: int, limit: int) -> list[Row]:
        return list(await self.fetch("rewound_page", after_seq=after_seq, limit=limit))

    async def rewound_untag(self, verdicts: Sequence[tuple[WriteId, str]],
                            now: datetime) -> None:
        at = to_text(now)
        async with self.transaction():
            for write_id, outcome in verdicts:
                await self.execute("rewound_untag", write_id=write_id, outcome=outcome, now=at)

    async def adopt_write_ids(self, pairs: Sequence[tuple[WriteId, str]],
                              now: datetime) -> list[WriteId]:
        """Each rewound record ``(its write_id, the target's)`` takes the target's write_id
        (a kept adoption row and its outbox event each); the new write_ids of the records
        that were still uncertain."""
        at = to_text(now)
        taken: list[WriteId] = []
        async with self.transaction():
            for was, found in pairs:
                await self.execute("record_write_id_adoption", write_id_was=was,
                                   write_id=found, now=at)
                if await self.fetch("adopt_write_id", write_id_was=was, write_id=found,
                                    now=at):
                    taken.append(WriteId(found))
        return taken

    async def rewind_done(self, now: datetime) -> bool:
        """End the pending rewind once no rewound record is left unread."""
        return bool(await self.fetch("rewind_done", now=to_text(now)))

    async def server_timeline(self) -> int | None:
        """The server's timeline (PostgreSQL: from the name of its current WAL file,
        readable by any role; a promoted standby begins a newer one), None on SQLite."""
        value = (await self.fetch("server_timeline"))[0][0]
        return None if value is None else int(value)

    async def record_timeline(self, timeline: int, replication: str, now: datetime) -> None:
        await self.execute("record_timeline", timeline=timeline, replication=replication,
                           now=to_text(now))

    async def adopt_target(self, previous_owner: str, target_id: str | None, reason: str,
                           now: datetime) -> None:
        """An operator's decision that this store replaces the target's owner (kept, with
        its outbox event); the next run raises the target's fence with it."""
        at = to_text(now)
        async with self.transaction():
            await self.execute("record_target_adoption", previous_owner=previous_owner,
                               target_id=target_id, reason=reason, now=at)
            await self.execute("set_adopting", previous_owner=previous_owner, now=at)
