"""The SQLite Store adapter (SPEC K1): the query mixins over one connection."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from runner.io.engine.candidates import CandidateOps
from runner.io.engine.delivery import DeliveryOps
from runner.io.engine.leads import FigureOps, LeadOps, OperatorOps, PollOps, RetentionOps
from runner.io.engine.marks import MarkOps
from runner.io.engine.pipeline import PipelineOps
from runner.io.sqlite import connection
from runner.io.sqlite.delivery import BlockingDispatch
from runner.io.sqlite.leads import LeadHooks
from runner.io.sqlite.pipeline import PipelineHooks

if TYPE_CHECKING:
    from runner.replication import Replication
    from runner.storedata import WantedScope


class SQLiteStore(FigureOps, LeadOps, PollOps, OperatorOps, RetentionOps, LeadHooks,
                  BlockingDispatch, MarkOps, DeliveryOps, CandidateOps, PipelineOps, PipelineHooks):
    """The store: the engine's operations (``runner.io.engine``) over this dialect's
    connection and hooks."""

    async def replication(self) -> Replication:
        """A single file: no replication (``runner.replication``)."""
        from runner.replication import SINGLE_FILE

        return SINGLE_FILE


async def open_sqlite_store(
    location: str, *, scope: WantedScope | None, create: bool, cache_kib: int | None = None
) -> SQLiteStore:
    path = connection.prepare_path(location, create=create)
    conn = await connection.connect(path, create=create, cache_kib=cache_kib)
    try:
        if create:
            version, pinned = await connection.migrate_and_pin(conn, path, scope)
        else:
            version, pinned = await connection.inspect(conn, path, scope)
    except sqlite3.Error as exc:
        await connection.close_quietly(conn)
        raise connection.translate(exc, "opening the store", path) from None
    except BaseException:
        await connection.close_quietly(conn)
        raise
    return SQLiteStore(conn, path, pinned, version)
