"""What every store is, whatever its dialect: one connection used by one task at a time
(a lock, and the task whose transaction is open), the scope pinned into it (a model built
on first use: ``status`` never needs it, and never loads pydantic), its schema version,
and ``async with`` closing it (``aclose`` shields itself from cancellation)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Self

import anyio

if TYPE_CHECKING:
    from runner.leads.models import Scope
    from runner.storedata import ScopeData


class StoreBase:
    scope_data: ScopeData | None
    _scope: Scope | None
    schema_version: int

    def _setup(self, scope: ScopeData | None, version: int, lock: anyio.Lock) -> None:
        self.scope_data = scope
        self._scope = None
        self.schema_version = version
        #: one statement at a time on the connection
        self._lock = lock
        #: the task inside reading() or transaction(): it holds the lock already, and its
        #: statements belong to the open transaction (any other task waits for the lock)
        self._owner: object | None = None

    def _inside(self) -> bool:
        """True in the task that has a transaction open (anyio.Lock is not reentrant)."""
        return self._owner is not None and self._owner == anyio.get_current_task().id

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        return nullcontext() if self._inside() else self._lock

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def scope(self) -> Scope | None:
        if self._scope is None and self.scope_data is not None:
            from runner.leads.models import Scope

            self._scope = Scope.model_validate(self.scope_data)
        return self._scope
