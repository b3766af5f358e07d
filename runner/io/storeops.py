"""Store operations that are the same on every backend, written once.

Each adapter supplies the primitives (``_transaction``, and the one-statement helpers
named below); these mixins compose them into the Store operations, so the transaction
boundaries cannot drift apart between SQLite and PostgreSQL.  A mixin is listed after
the adapter's base class, so the base's own methods are the ones that run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.errors import OutboxPruned
from runner.retention import below_floor

if TYPE_CHECKING:
    from runner.models import Scope
    from runner.storedata import ScopeData
    from runner.storework import ObservationWrite


class PinnedScope:
    """The pinned scope as a model, built on first use (``status`` never needs it)."""

    scope_data: ScopeData | None
    _scope: Scope | None

    @property
    def scope(self) -> Scope | None:
        if self._scope is None and self.scope_data is not None:
            from runner.models import Scope

            self._scope = Scope.model_validate(self.scope_data)
        return self._scope


class PollOps:
    """A poll pass's writes (L12): observations and poll health, one transaction."""

    if TYPE_CHECKING:
        def _transaction(self) -> AbstractAsyncContextManager[Any]: ...
        async def _observations(self, writes: Sequence[ObservationWrite], at: str) -> int: ...
        async def _poll_health(self, failure: str | None, at: str) -> bool: ...
        async def _clamp_poll_times(self, at: str) -> None: ...

    async def apply_observations(self, writes: Sequence[ObservationWrite], now: datetime) -> int:
        if not writes:
            return 0
        async with self._transaction():
            return await self._observations(writes, to_text(now))

    async def record_poll_health(self, failure: str | None, now: datetime) -> bool:
        async with self._transaction():
            return await self._poll_health(failure, to_text(now))

    async def record_poll_pass(
        self, writes: Sequence[ObservationWrite], failure: str | None, now: datetime
    ) -> tuple[int, bool]:
        at = to_text(now)
        async with self._transaction():
            # time that went backwards: a poll time after ``now`` counts as ``now``, so
            # the records polled "in the future" take their turn again (oldest poll first)
            await self._clamp_poll_times(at)
            changed = await self._observations(writes, at) if writes else 0
            return changed, await self._poll_health(failure, at)


class RetentionOps:
    """Outbox reads that vouch for the prune floor (``runner.retention``): each adapter
    supplies ``_floor`` and ``_export_rows`` (``seq, kind, subject, payload, at`` rows)."""

    if TYPE_CHECKING:
        def _guard(self) -> AbstractAsyncContextManager[Any]: ...
        async def _floor(self) -> int: ...
        async def _export_rows(self, after_seq: int, limit: int) -> Sequence[Any]: ...

    async def check_outbox_floor(self, after_seq: int) -> None:
        """Raise OutboxPruned if events after ``after_seq`` were pruned (call after the
        read it vouches for)."""
        async with self._guard():
            floor = await self._floor()
        if (why := below_floor(after_seq, floor)) is not None:
            raise OutboxPruned(why)

    async def export_outbox(self, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Events after ``after_seq`` in sequence order, at most ``limit``, whole."""
        async with self._guard():
            rows = await self._export_rows(after_seq, limit)
        await self.check_outbox_floor(after_seq)
        return [{"seq": int(r[0]), "kind": str(r[1]), "subject": r[2],
                 "payload": json.loads(r[3]), "at": str(r[4])} for r in rows]
