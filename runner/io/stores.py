"""Composition: the store adapter a location names (a ``postgresql://`` DSN or a file
path).  The edge (commands, the library façade) calls these; nothing below ``runner.io``
imports them: a task that needs a store of its own is handed an opener."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import StoreError
from runner.storedata import is_postgres

if TYPE_CHECKING:
    from runner.store import Store
    from runner.storedata import WantedScope


#: asyncpg is an optional dependency: nothing imports it until a DSN is opened, and a
#: missing driver is one clear line instead of a traceback
POSTGRES_INSTALL_HINT = "PostgreSQL support is not installed: pip install 'runner[postgres]'"


def _require_postgres_driver() -> None:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise StoreError(POSTGRES_INSTALL_HINT) from None


def describe_location(location: str) -> str:
    """A store's location for messages: a path, or ``schema 'x' at host:port/db`` (a DSN
    is never echoed: it may carry a password)."""
    if is_postgres(location):
        from runner.io.postgres.dsn import describe, schema_of

        return f"schema {schema_of(location)!r} at {describe(location)}"
    return repr(location)


async def store_exists(location: str) -> bool:
    """Whether a store is at ``location`` (a file; on PostgreSQL, runner's schema in the
    database), without creating anything."""
    if is_postgres(location):
        _require_postgres_driver()
        from runner.io.postgres.store import store_exists as postgres_store_exists

        return await postgres_store_exists(location)
    import anyio

    return await anyio.Path(location).exists()


async def open_store(
    location: str, *, scope: WantedScope | None = None, create: bool = True,
    cache_kib: int | None = None,
) -> Store:
    """Open (and with ``create``, create and migrate) the store at ``location``.

    With ``scope``, the scope is pinned if the store has none yet, in the same transaction
    that creates the store (K9), or compared with the pinned one (ConfigMismatch, exit 78).
    Without ``create`` nothing is written: a missing store is StoreNotFound and an older
    schema is reported, not migrated.  ``cache_kib`` bounds the SQLite page cache of this
    connection (the adapter's default otherwise); PostgreSQL caches on the server and
    ignores it.
    """
    if is_postgres(location):
        _require_postgres_driver()
        from runner.io.postgres.store import open_postgres_store

        return await open_postgres_store(location, scope=scope, create=create)
    from runner.io.sqlite.store import open_sqlite_store

    return await open_sqlite_store(location, scope=scope, create=create, cache_kib=cache_kib)
