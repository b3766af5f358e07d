"""The library API (SPEC L14): ``DurableWorker(db, scope, port)``.

The CLI is a thin shell over this class; a user can drive runner from their own code and
plug in their own target adapter::

    async with DurableWorker("/srv/leads/queue.db", scope, port) as worker:
        result = await worker.accept({"tenant_id": ..., "source_lead_id": ..., ...})
        print(await worker.status())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner import intake
from runner.clock import Clock, SystemClock
from runner.errors import UsageError
from runner.models import LeadEvent, Scope
from runner.status import status_document
from runner.store import Store, open_store


class DurableWorker:
    """A durable inbox bound to one scope.  Open with ``async with``."""

    def __init__(
        self,
        db: str,
        scope: Scope | Mapping[str, Any],
        port: object | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.db = db
        self.scope = scope if isinstance(scope, Scope) else Scope.model_validate(dict(scope))
        self.port = port
        self.clock: Clock = clock or SystemClock()
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UsageError("DurableWorker is not open; use 'async with DurableWorker(...)'")
        return self._store

    async def open(self) -> DurableWorker:
        if self._store is None:
            self._store = await open_store(self.db, scope=self.scope, create=True)
        return self

    async def aclose(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            await store.aclose()

    async def __aenter__(self) -> DurableWorker:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def accept(self, record: Mapping[str, Any] | LeadEvent) -> intake.AcceptResult:
        """Validate and durably accept one event; answers after the commit."""
        return await intake.accept(self.store, self.clock, self.scope, record)

    async def status(self) -> dict[str, Any]:
        """The status document of SPEC L13."""
        return await status_document(self.store)
