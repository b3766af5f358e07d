"""Store operations that are the same on every backend, written once.

Each adapter supplies the primitives (``_transaction``, and the one-statement helpers
named below); these mixins compose them into the Store operations, so the transaction
boundaries and the crash points around the sweep's commit cannot drift apart between
SQLite and PostgreSQL.  A mixin is listed after the adapter's base class, so the base's
own methods are the ones that run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio.from_thread

from runner.lifecycle.results import ExpireResult, ReconcileResult, SweepResult

if TYPE_CHECKING:
    from runner.ids import WriteId
    from runner.lifecycle.results import SweepFunction
    from runner.states import LeadState


class _Finishing(Protocol):
    async def finish_and_mark(
        self, done: tuple[WriteId, LeadState] | None, next_write_id: WriteId, now: datetime
    ) -> int | None: ...


class LoopDispatchSteps:
    """Dispatch steps (``runner.store.DispatchSteps``) that run a store's own async
    ``finish_and_mark`` on the event loop, called from the dispatch run's worker thread:
    for a store whose driver is async (asyncpg), and for test wrappers that count or fail
    the store's operations.  Each step is one hop back to the loop."""

    def __init__(self, store: _Finishing) -> None:
        self._store = store

    def finish_and_mark(
        self, done: tuple[WriteId, LeadState] | None, next_write_id: WriteId, now: datetime
    ) -> int | None:
        return anyio.from_thread.run(self._store.finish_and_mark, done, next_write_id, now)


@asynccontextmanager
async def loop_dispatch_steps(store: _Finishing) -> AsyncIterator[LoopDispatchSteps]:
    """``Store.dispatch_steps`` for a store whose operations are all async."""
    yield LoopDispatchSteps(store)


class SweepOps:
    """The candidate sweeps (C4): each one transaction, its run recorded for ``status``."""

    if TYPE_CHECKING:
        def _transaction(self) -> AbstractAsyncContextManager[Any]: ...
        async def _expire(self, now: datetime) -> int: ...
        async def _reconcile(self, now: datetime) -> int: ...
        async def _record_sweep(self, function: SweepFunction, now: datetime,
                                result: Mapping[str, object]) -> None: ...

    async def sweep_expired(self, now: datetime) -> ExpireResult:
        async with self._transaction():
            result = ExpireResult(expired=await self._expire(now))
            await self._record_sweep("sweepExpired", now, result)
        return result

    async def reconcile_stuck_promoting(self, now: datetime) -> ReconcileResult:
        async with self._transaction():
            result = ReconcileResult(reconciled=await self._reconcile(now))
            await self._record_sweep("reconcileStuckPromoting", now, result)
        return result

    async def sweep_candidates(self, now: datetime) -> SweepResult:
        from runner import crashpoints

        async with self._transaction():
            expired = await self._expire(now)
            result = SweepResult(expired=expired, reconciled=await self._reconcile(now))
            await self._record_sweep("sweepCandidates", now, result)
            crashpoints.hit("sweep.before-commit")  # written, not committed
        crashpoints.hit("sweep.after-commit")
        return result
