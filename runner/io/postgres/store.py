"""The PostgreSQL Store adapter (SPEC K1): the query mixins over one session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.io.engine.candidates import CandidateOps
from runner.io.engine.delivery import DeliveryOps
from runner.io.engine.leads import FigureOps, LeadOps, OperatorOps, PollOps, RetentionOps
from runner.io.engine.pipeline import PipelineOps
from runner.io.postgres import connection
from runner.io.postgres.delivery import FencedMark
from runner.io.postgres.dsn import parse
from runner.io.postgres.leads import LeadHooks
from runner.io.postgres.pipeline import PipelineHooks

if TYPE_CHECKING:
    from runner.leads.models import Scope


class PostgresStore(FigureOps, LeadOps, PollOps, OperatorOps, RetentionOps, LeadHooks,
                    FencedMark, DeliveryOps, CandidateOps, PipelineOps, PipelineHooks):
    """The store: the engine's operations (``runner.io.engine``) over this dialect's
    connection and hooks."""


async def open_postgres_store(
    location: str, *, scope: Scope | None, create: bool
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
