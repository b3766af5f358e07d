"""The PostgreSQL Store adapter (SPEC K1): the query mixins over one session."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from runner.errors import AccessDenied
from runner.io.engine.candidates import CandidateOps
from runner.io.engine.delivery import DeliveryOps
from runner.io.engine.leads import FigureOps, LeadOps, OperatorOps, PollOps, RetentionOps
from runner.io.engine.marks import MarkOps
from runner.io.engine.pipeline import PipelineOps
from runner.io.postgres import connection
from runner.io.postgres.delivery import ApartSteps, FencedMark
from runner.io.postgres.dsn import parse
from runner.io.postgres.leads import LeadHooks
from runner.io.postgres.pipeline import PipelineHooks

if TYPE_CHECKING:
    from runner.replication import Replication
    from runner.storedata import WantedScope


class PostgresStore(FigureOps, LeadOps, PollOps, OperatorOps, RetentionOps, LeadHooks,
                    ApartSteps, FencedMark, MarkOps, DeliveryOps, CandidateOps, PipelineOps,
                    PipelineHooks):
    """The store: the engine's operations (``runner.io.engine``) over this dialect's
    connection and hooks."""

    async def replication(self) -> Replication:
        """The server's replication settings and WAL senders, classified (one read;
        ``runner.replication`` says what a plain role sees)."""
        from runner.replication import Sender, classify

        try:
            (row,) = await self.fetch("_replication_facts")
        except AccessDenied:  # a role that may not read pg_stat_replication
            (row,) = await self.fetch("_replication_settings")
            return classify(names=str(row[0]), commit=str(row[1]), in_recovery=bool(row[2]),
                            senders=None)
        senders = [Sender(str(name or ""), state, sync) for name, state, sync in
                   json.loads(row[3])]
        return classify(names=str(row[0]), commit=str(row[1]), in_recovery=bool(row[2]),
                        senders=senders)


async def open_postgres_store(
    location: str, *, scope: WantedScope | None, create: bool
) -> PostgresStore:
    loc = parse(location)
    conn = await connection.connect(loc)
    try:
        if create:
            version, pinned = await connection.migrate_and_pin(conn, loc, scope)
        else:
            version, pinned = await connection.inspect(conn, loc, scope)
    except BaseException as exc:
        await connection.close_quietly(conn)
        if isinstance(exc, connection.TRANSLATED):
            raise connection.translate(exc, "opening the store", loc.where) from None
        raise
    return PostgresStore(conn, loc, pinned, version)


async def store_exists(location: str) -> bool:
    """Whether runner's schema exists in the database (nothing is created)."""
    loc = parse(location)
    conn = await connection.connect(loc)
    try:
        return await connection.schema_exists(conn, loc)
    except connection.TRANSLATED as exc:
        raise connection.translate(exc, "looking for the store", loc.where) from None
    finally:
        await connection.close_quietly(conn)
