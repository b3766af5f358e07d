"""PostgreSQL's delivery hook: while this store holds the worker lock
(``runner.io.postgres.lock``), the statement that marks a record in flight also checks
that the lock's session still holds it (``_finish_and_mark_fenced``).  If that session
has ended, nothing changes and the send does not start (``LockLost``, exit 74); the
caller then records the outcome alone (``finish_send`` is not fenced).  Once the lock's
session is known to be gone (``FENCE_LOST``: its termination was heard, or a reconnect
dropped it) a mark is refused without asking the server, until the lock is held again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runner.errors import LockLost
from runner.io.engine.base import Row
from runner.io.postgres.base import PostgresBase
from runner.io.postgres.lock import FENCE_LOST, Fence


class FencedMark(PostgresBase):
    """Overrides ``DeliveryOps._marking`` and ``DeliveryOps._marking_batch``."""

    #: a batch's mark and its seq are one transaction (``DeliveryOps.mark_batch``), which
    #: takes ``lead_counts`` before the outbox counter, as an accept does
    #: (``_lock_lead_counts``); aborted as a deadlock victim all the same (by another
    #: writer), it is run again, as a single statement is (``PostgresBase._fetch``)
    mark_attempts = 5

    async def _marking(self, params: dict[str, Any]) -> Sequence[Row]:
        if (fence := self._fence) is None:
            return await self.fetch("finish_and_mark", **params)
        return self._held(await self.fetch("_finish_and_mark_fenced", **params,
                                           **self._live(fence).params()))

    async def _marking_batch(self, params: dict[str, Any]) -> Sequence[Row]:
        if self._inside():  # mark_batch's transaction: the accept's lock order first
            await self.fetch("_lock_lead_counts")
        if (fence := self._fence) is None:
            return await self.fetch("finish_and_mark_batch", **params)
        return self._held(await self.fetch("_finish_and_mark_batch_fenced", **params,
                                           **self._live(fence).params()))

    def _live(self, fence: Fence) -> Fence:
        """``fence``, unless the lock's session is known to be gone (then LockLost)."""
        if fence is FENCE_LOST:
            raise self._lost()
        return fence

    def _held(self, rows: Sequence[Row]) -> Sequence[Row]:
        """The rows a fenced statement changed; LockLost if the lock was no longer held
        (then it changed nothing)."""
        if not rows[0][0]:
            raise self._lost()
        return [row[1:] for row in rows if row[1] is not None]

    def _lost(self) -> LockLost:
        return LockLost(f"the worker lock's session at {self.location.where} has ended "
                        "(terminated, timed out, or its server restarted); not sending: "
                        "what is in flight is recovered once the lock is held again")
