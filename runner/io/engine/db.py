"""The connection port (``Db``): all that the engine's operations ask of a dialect.

Statements are named (``runner.io.engine.queries``); ``params`` are the ``:param`` values.
A statement outside ``transaction()`` is its own transaction.  Rows are positional (both
drivers' rows index by column number), in the column order the query's SELECT or
RETURNING names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Row = Sequence[Any]


class Db(Protocol):
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
