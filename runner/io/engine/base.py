"""The connection port (``Db``: all that the engine's operations ask of a dialect) and
what every store is, whatever its dialect: one connection used by one task at a time
(a lock, and the task whose transaction is open), the scope pinned into it (a model built
on first use: ``status`` never needs it, and never loads pydantic), its schema version,
and ``async with`` closing it (``aclose`` shields itself from cancellation)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, Self

import anyio

if TYPE_CHECKING:
    from runner.leads.models import Scope
    from runner.storedata import ScopeData


# -- the connection port --------------------------------------------------------------

Row = Sequence[Any]


class Db(Protocol):
    """Statements are named (``runner.io.engine.queries``); ``params`` are the ``:param``
    values.  A statement outside ``transaction()`` is its own transaction.  Rows are
    positional (both drivers' rows index by column number), in the column order the
    query's SELECT or RETURNING names them."""

    backend: str

    async def fetch(self, name: str, /, **params: Any) -> Sequence[Row]:
        """The rows the named statement returns (``RETURNING`` rows for a write)."""
        ...

    async def execute(self, name: str, /, **params: Any) -> int:
        """Run a named write; the number of rows it changed (triggers' rows excluded)."""
        ...

    async def execute_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run a named write once per parameter set, as one statement batch."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """Several statements as one transaction; rolled back on any error or
        cancellation."""
        ...

    def reading(self) -> AbstractAsyncContextManager[None]:
        """One consistent snapshot for several reads."""
        ...


# -- what every store is --------------------------------------------------------------

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
        #: pipeline claims (fencing token, time) that could not be given back because the
        #: session was lost: given back once it is opened again (``_reconnected``)
        self._unreleased: list[tuple[int, int]] = []

    def _inside(self) -> bool:
        """True in the task that has a transaction open (anyio.Lock is not reentrant)."""
        return self._owner is not None and self._owner == anyio.get_current_task().id

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        return nullcontext() if self._inside() else self._lock

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _reconnected(self) -> None:
        """Hook: the store's session was just opened anew (``reconnect``)."""

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
