"""The PostgreSQL adapter (SPEC K1), through asyncpg, an optional dependency.

Nothing here imports asyncpg until a ``postgresql://`` store is opened, so SQLite-only
commands never load it, and a missing driver is one clear line instead of a traceback.

::

    connection.py   the session (name, keepalives), error translation, migrations, scope pin
    schema.py       DDL, triggers and versioned migrations, in a schema of its own
    lock.py         the worker lock: a session advisory lock, and the in-flight fence
    base.py         one session per store, statement helper, consistent reads
    leads.py        accept, summary, records
    delivery.py     guarded state transitions of the delivery cycle
    observe.py      status observations and poll health
    candidates.py   the candidate lifecycle (candidates_schema.py: its DDL, migration v4)
    store.py        the Store: the mixins together, and opening one
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import StoreError

if TYPE_CHECKING:
    from runner.io.postgres.store import PostgresStore
    from runner.models import Scope

INSTALL_HINT = "PostgreSQL support is not installed: pip install 'runner[postgres]'"


def _require_driver() -> None:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise StoreError(INSTALL_HINT) from None


async def postgres_store_exists(location: str) -> bool:
    _require_driver()
    from runner.io.postgres.store import store_exists

    return await store_exists(location)


async def open_postgres_store(
    location: str, *, scope: Scope | None, create: bool
) -> PostgresStore:
    _require_driver()
    from runner.io.postgres.store import open_postgres_store as open_store

    return await open_store(location, scope=scope, create=create)
