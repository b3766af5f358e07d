"""The PostgreSQL table target's adapter: blocking, as every adapter is, over asyncpg.

runner calls adapters in worker threads, and asyncpg is asynchronous: the adapter keeps a
private event loop in a daemon thread of its own and one session on it, and each blocking
call hands a coroutine to that loop and waits for its result (bounded: every statement has
the ``timeout`` of ``--target-timeout``, every connection attempt its own).  A call that
runner abandons (a cancelled send) goes on in the loop until the server answers; the
calls of one adapter are serialized by a lock, as one session runs one statement at a
time (:mod:`.session`: the loop, the session kept, the reads' and the checks' retry).

A write sends one statement, ``INSERT … SELECT * FROM unnest(…) ON CONFLICT (write_id)
DO NOTHING``, for the whole batch (one array per column: one round trip, no parameter
limit; measured 1.2-1.4 times as fast as ``executemany`` of the same rows), which
answers with the batch's rows as stored (``queries.sql``, ``insert_rows``): the write
returns them, and runner sends no readback for the batch.  Before it,
the session is made sure of: a session that is closed, or idle for more than
``PING_AFTER`` seconds (a server restarted meanwhile, a proxy that dropped it), is pinged
or replaced first, and a failure there is "not sent" (:mod:`.classify`).  Reads go by
``write_id = ANY(array)``: one statement for any number of write_ids; a read, or the
checks before work, on a kept session that turns out gone is made once more on a new
one (``_repeatable``), a write never.

The table is created, or a user's table adopted, only by ``prepare_writes(create=True)``
(runner's check before the first send of a store that has not delivered yet); reads and
``target_id`` never create or change anything (:mod:`.shape` for what a table must be).

Batch marks (issue 30, :mod:`runner.leads.marks`): the adapter declares
``marks_batches``.  The mark is one row of a side table, ``<table>_runner_mark``
(:mod:`.shape`), made with the table, or by the checks before work (or the first marked
write) for a table made before marks.  A marked batch is one transaction: ``SELECT … FOR
UPDATE`` of the mark's row (concurrent marked writers serialise on it), the check
(:func:`~runner.leads.marks.judge`), then the rows' ``INSERT … ON CONFLICT (write_id) DO
NOTHING`` and the new mark in one statement, then ``COMMIT``; a refused batch is rolled
back having applied nothing.  A role that may not create the mark table (a user's table
in a schema runner may not create in) turns marks off with a warning, and runner delivers
as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from runner import crashpoints
from runner.errors import AccessDenied, RunnerError, TargetAbsent, TargetUnavailable, UsageError
from runner.io.postgres.connection import TRANSLATED, stable_key, translate
from runner.io.targets.pgtable import shape
from runner.io.targets.pgtable.classify import Phase, classify_write
from runner.io.targets.pgtable.session import (
    CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    TableSession,
    server_error,
)
from runner.leads.marks import NO_MARK, BatchMark, Key, TargetMark, judge
from runner.leads.port import (
    AmbiguousWriteError,
    Observation,
    TargetError,
    TargetRow,
    observe_rows,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord

log = logging.getLogger("runner.target")

T = TypeVar("T")


def _target_row(row: Sequence[Any]) -> TargetRow:
    """A row as read (write_id, the five fields, status)."""
    return TargetRow(row[0], {"tenant": row[1], "source": row[2], "source_lead_id": row[3],
                              "is_test": row[4], "contact_alias": row[5]}, row[6])


def _answered(rows: Sequence[Sequence[Any]], write_ids: Sequence[str]
              ) -> list[TargetRow] | None:
    """A batch statement's answer as the rows runner judges the batch by; None if a
    write_id of the batch has no row in it (``insert_rows`` in ``queries.sql``)."""
    found = [_target_row(row) for row in rows]
    return found if {row.write_id for row in found} >= set(write_ids) else None


def _late(where: str) -> Callable[[], Exception]:
    """The error of a write whose answer did not come in time: it may have been applied."""
    def late() -> Exception:
        error = AmbiguousWriteError(f"{where} did not answer the batch in time: it may "
                                    "have been applied")
        error.failure = "timed_out"
        return error

    return late


class PgTableTarget(TableSession):
    """A CRM adapter that delivers into a PostgreSQL table (blocking; runner calls it in a
    thread).  ``target`` is a ``postgresql://`` DSN, ``table`` a ``--target-table`` name
    (``names``); ``timeout`` bounds every statement (seconds)."""

    #: a second write of a write_id the table holds adds no row (its primary key and
    #: ``ON CONFLICT (write_id) DO NOTHING``), and answers as a first one does
    dedupes_write_id = True

    def __init__(self, target: str, table: str, *, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        super().__init__(target, table, timeout=timeout, connect_timeout=connect_timeout)
        #: whether the mark table is known to be there (checked, or made, this session)
        self._mark_ready = False
        #: False once the checks before work found that marks cannot be kept here
        self._marks = True

    def __repr__(self) -> str:
        return f"PgTableTarget({self.location.describe()!r})"

    @property
    def marks_batches(self) -> bool:
        """Whether this table keeps batch marks (issue 30): true, unless the checks before
        work found that runner's role cannot make or write its mark table."""
        return self._marks

    # -- the table: its facts, identity, creation -----------------------------------------

    async def _facts(self, conn: asyncpg.Connection) -> tuple[shape.TableFacts, int | None]:
        loc = self.location
        row = await conn.fetchrow(self._sql["inspect_table"], loc.schema, loc.table)
        assert row is not None
        if not row["has_schema"]:
            return shape.TableFacts(has_schema=False, exists=False), None
        oid = row["table_oid"]
        marks = tuple((str(c[0]), str(c[1])) for c in await conn.fetch(
            self._sql["mark_columns"], loc.mark_ident))
        if oid is None:
            return shape.TableFacts(True, False, store_schema=row["store_schema"],
                                    mark_columns=marks), None
        columns = await conn.fetch(self._sql["table_columns"], oid)
        return shape.TableFacts(
            True, True, kind=row["kind"], comment=row["comment"],
            store_schema=row["store_schema"], keyed=row["keyed"],
            columns=shape.column_facts([tuple(c) for c in columns]),
            mark_columns=marks), int(oid)

    def _refuse_store_table(self, facts: shape.TableFacts) -> None:
        if facts.store_schema and self.location.table in shape.store_tables():
            raise TargetUnavailable(
                f"{self.where} is one of runner's own store tables (schema "
                f"{self.location.schema!r} holds a runner store): name another table; "
                "nothing was changed")

    def _checked(self, facts: shape.TableFacts, *, create: bool) -> None:
        """Raise for a table that cannot be read as a target (absent, wrong shape)."""
        self._refuse_store_table(facts)
        if not facts.has_schema:
            raise TargetAbsent(f"no schema {self.location.schema!r} for the {self.where} "
                               "(runner creates the table, not its schema: create it first)")
        marks = shape.mark_problems(facts.mark_columns, self.location.mark_table)
        if not facts.exists:
            if marks:
                raise TargetUnavailable(f"the {self.where} cannot be created: "
                                        + "; ".join(marks) + "; nothing was changed")
            if create:
                return
            raise TargetAbsent(f"no {self.where} (a table is created only by a delivery "
                               "run, once or start, of a store that has not delivered yet)")
        refusal = shape.refusal(facts, self.location.table, self.where, marks)
        if refusal is not None:
            raise TargetUnavailable(refusal)

    def _unavailable(self, exc: BaseException, doing: str) -> RunnerError:
        """A failure of the checks before work, as one of runner's errors (one line)."""
        if isinstance(exc, RunnerError):
            return exc
        if isinstance(exc, TRANSLATED):
            found = translate(exc, doing, self.location.where)
            if isinstance(found, AccessDenied | UsageError):
                return found
            return TargetUnavailable(f"the {self.where}: {found.message}")
        return TargetUnavailable(f"the {self.where} failed while {doing}: "
                                 f"{type(exc).__name__}")

    def _checking(self, fn: Callable[[], Awaitable[T]], doing: str) -> T:
        async def go() -> T:
            try:
                return await fn()
            except Exception as exc:  # noqa: BLE001 - any failure stops the run, one line
                if not server_error(exc):
                    self._drop()
                raise self._unavailable(exc, doing) from None

        return self._call(go, lambda: TargetUnavailable(
            f"the {self.where} did not answer in time while {doing}"))

    def target_id(self) -> str:
        """The table's identity (its comment's ``runner-target-id``), read without
        creating or changing anything."""
        async def read(conn: asyncpg.Connection) -> str:
            facts, _ = await self._facts(conn)
            self._checked(facts, create=False)
            found = shape.identity(facts.comment)
            if found is None:
                raise TargetUnavailable(
                    f"the {self.where} has no runner identity yet (a delivery run, once or "
                    "start, of a store that has not delivered yet adopts it)")
            return found

        return self._checking(lambda: self._repeatable(read), "reading its identity")

    def prepare_writes(self, create: bool) -> None:
        """Check that writes can start, before any record is marked in flight: the server
        takes writes, the table has the target's shape and identity and runner's role may
        insert into it and read it.  With ``create``, a missing table is created with its
        identity, or a table of the right shape without one adopted (its identity written
        into its comment), in one transaction; a refusal changes nothing."""
        async def prepare(conn: asyncpg.Connection) -> None:
            outcome = ""
            async with conn.transaction():
                await conn.execute(self._sql["lock_table"],
                                   stable_key("runner.pgtable", self.location.schema,
                                              self.location.table))
                facts, oid = await self._facts(conn)
                self._checked(facts, create=create)
                if await conn.fetchval("SELECT pg_is_in_recovery()"):
                    raise TargetUnavailable(f"the {self.where} is on a read-only server (a "
                                            "standby?): it takes no writes")
                if oid is not None:
                    self._check_privileges(await conn.fetchrow(
                        self._sql["table_privileges"], oid))
                found = shape.identity(facts.comment)
                if found is None and not create:
                    raise TargetUnavailable(
                        f"the {self.where} has no runner identity, and this store has "
                        "delivered before: runner adopts a table only for a store that has "
                        "not delivered yet")
                if not facts.exists:
                    await conn.execute(self._sql["create_table"])
                    await conn.execute(self._sql["create_key_index"])
                    outcome = "created"
                if found is None:
                    found = shape.new_identity()
                    await self._write_identity(conn, facts.comment, found)
                    outcome = outcome or "adopted"
                await self._prepare_marks(conn, made=bool(facts.mark_columns))
            if outcome:
                log.info("target table %s: %s", outcome, self.location.name,
                         extra={"action": f"target.table_{outcome}",
                                "table": self.location.name, "target_id": found})

        self._checking(lambda: self._repeatable(prepare), "checking it can be written")

    async def _write_identity(self, conn: asyncpg.Connection, comment: str | None,
                              target_id: str) -> None:
        statement = await conn.fetchval(self._sql["comment_statement"], self.location.schema,
                                        self.location.table,
                                        shape.with_identity(comment, target_id))
        try:
            await conn.execute(statement)
        except asyncpg.InsufficientPrivilegeError:
            raise AccessDenied(
                f"the {self.where} has no runner identity, and adopting it writes one into "
                "its comment, which only its owner may write: let runner's role own it, or "
                "have its owner write the identity (see 'Deliver into a PostgreSQL "
                "table'); nothing was changed") from None

    async def _prepare_marks(self, conn: asyncpg.Connection, *, made: bool) -> None:
        """In the checks' transaction: make the mark table if it is not there (a table made
        before marks); marks are turned off (with a warning) when runner's role may not
        make it, or may not read and write it."""
        if not made:
            try:
                async with conn.transaction():  # a savepoint: a refusal keeps the rest
                    await conn.execute(self._sql["create_mark_table"])
                    await conn.execute(self._sql["insert_mark_row"])
            except asyncpg.InsufficientPrivilegeError:
                self._marks_off("runner's role may not create it")
                return
            log.info("target table %s: mark table %s made", self.location.name,
                     self.location.mark_table,
                     extra={"action": "target.mark_table_made", "table": self.location.name})
        allowed = await conn.fetchval(self._sql["mark_privileges"], self.location.mark_ident)
        if not allowed:
            self._marks_off("runner's role may not SELECT, INSERT and UPDATE it")
            return
        self._marks = self._mark_ready = True

    def _marks_off(self, why: str) -> None:
        self._marks = False
        loc = self.location
        log.warning("target table %s keeps no batch marks: its mark table %s.%s is not "
                    "usable (%s); runner delivers without them (see 'Deliver into a "
                    "PostgreSQL table': the mark table)", loc.name, loc.schema,
                    loc.mark_table, why,
                    extra={"action": "target.marks_off", "table": loc.name})

    def _check_privileges(self, row: asyncpg.Record | None) -> None:
        assert row is not None
        missing = [what for what, ok in (("INSERT", row["can_insert"]),
                                         ("SELECT", row["can_select"])) if not ok]
        if missing:
            raise AccessDenied(
                f"runner's role may not {' or '.join(missing)} on the {self.where}: "
                f"GRANT SELECT, INSERT ON {self.location.name} TO the role runner "
                "connects as")

    # -- the port -------------------------------------------------------------------------

    def write(self, record: CRMRecord, write_id: str) -> list[TargetRow] | None:
        return self.write_batch([(record, write_id)])

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]],
                    mark: BatchMark | None = None) -> list[TargetRow] | None:
        """One ``INSERT … ON CONFLICT (write_id) DO NOTHING`` for the whole batch: all
        rows or none; a write_id the table holds already adds no row.  With ``mark``,
        the check and the new mark are in the rows' transaction (the module docstring):
        ``StaleMark`` or ``ForeignMark`` when refused, nothing applied.  Returns the
        batch's rows as the table holds them once the statement committed (the
        statement's answer, ``queries.sql``), so runner sends no readback; None when
        that answer does not cover every write_id of the batch (runner then reads the
        batch back)."""
        if not items:
            return None
        columns = (
            [write_id for _, write_id in items],
            [record.tenant for record, _ in items],
            [record.source for record, _ in items],
            [record.source_lead_id for record, _ in items],
            [record.is_test for record, _ in items],
            [record.contact_alias for record, _ in items],
        )

        async def insert() -> list[Any]:
            phase: Phase = "connect"
            try:
                conn = await self._session()
                phase = "statement"
                rows = await conn.fetch(self._sql["insert_rows"], *columns,
                                        timeout=self.timeout)
                self._last_used = time.monotonic()
                return list(rows)
            except Exception as exc:  # noqa: BLE001 - classified: only a sure "not sent"
                if not server_error(exc):
                    self._drop()
                raise classify_write(exc, phase, self.where) from None

        if mark is None:
            rows = self._call(insert, _late(self.where))
        else:
            rows = self._call(lambda: self._marked(mark, None, "insert_rows_marked",
                                                   *columns),
                              _late(self.where), statements=3)[1]
        crashpoints.hit("dispatch.batch-applied")
        return _answered(rows, columns[0])

    async def _marked(self, mark: BatchMark, replaces: str | None, statement: str,
                      *args: Any) -> tuple[TargetMark, list[Any]]:
        """One marked transaction: lock the mark's row, judge, ``statement`` (the rows and
        the new mark, or the new mark alone) with ``args`` then the mark, commit; the mark
        it replaced and the statement's answer.  Raises StaleMark or ForeignMark (rolled
        back: nothing applied), else what ``classify_write`` makes of a failure in its
        phase."""
        phase: Phase = "connect"
        try:
            conn = await self._session()
            phase = "uncommitted"
            if not self._mark_ready:
                await self._make_mark_table(conn)
            transaction = conn.transaction()
            await transaction.start()
            try:
                held = await self._lock_mark(conn)
                judge(held, mark, replaces)
                rows = await conn.fetch(self._sql[statement], *args, mark.store_id,
                                        mark.seq, timeout=self.timeout)
                phase = "commit"
                await transaction.commit()
            except BaseException as exc:
                if phase == "uncommitted":
                    await self._roll_back(transaction, exc)
                raise
            self._last_used = time.monotonic()
            return held, list(rows)
        except TargetError:
            raise  # refused by its mark: rolled back above
        except Exception as exc:  # noqa: BLE001 - classified: only a sure "not sent"
            if isinstance(exc, asyncpg.UndefinedTableError):
                self._mark_ready = False  # dropped meanwhile: made again next time
            if not server_error(exc):
                self._drop()
            raise classify_write(exc, phase, self.where) from None

    async def _roll_back(self, transaction: Any, exc: BaseException) -> None:
        """End an uncommitted transaction: a ROLLBACK on a live session, else the session
        is dropped (the server rolls back a transaction whose session ends)."""
        if isinstance(exc, TargetError) or server_error(exc):
            # not rolled back (the session failed meanwhile): the session goes instead
            with contextlib.suppress(Exception):
                await asyncio.wait_for(transaction.rollback(), self.timeout)
                return
        self._drop()

    async def _make_mark_table(self, conn: asyncpg.Connection) -> None:
        """The mark table, made if it is not there (a table made before marks, a mark
        table dropped since), under the table's creation lock."""
        async with conn.transaction():
            await conn.execute(self._sql["lock_table"], stable_key(
                "runner.pgtable", self.location.schema, self.location.table))
            await conn.execute(self._sql["create_mark_table"], timeout=self.timeout)
            await conn.execute(self._sql["insert_mark_row"], timeout=self.timeout)
        self._mark_ready = True

    async def _lock_mark(self, conn: asyncpg.Connection) -> TargetMark:
        """The mark's row, locked for this transaction (made again if it was deleted)."""
        row = await conn.fetchrow(self._sql["lock_mark"], timeout=self.timeout)
        if row is None:
            await conn.execute(self._sql["insert_mark_row"], timeout=self.timeout)
            row = await conn.fetchrow(self._sql["lock_mark"], timeout=self.timeout)
        assert row is not None
        return TargetMark(row["owner"], int(row["seq"]))

    def raise_mark(self, mark: BatchMark, replaces: str | None = None) -> TargetMark:
        """The fence alone (no rows), in one transaction with its check: refused as a
        batch is (``StaleMark``, ``ForeignMark``), except that an owner equal to
        ``replaces`` is replaced; the mark it replaced."""
        return self._call(lambda: self._marked(mark, replaces, "set_mark"), _late(self.where),
                          statements=3)[0]

    def read_mark(self) -> TargetMark:
        """What the mark table holds (``NO_MARK`` while it has no marked batch, or is not
        there yet); reads only."""
        async def fetch(conn: asyncpg.Connection) -> TargetMark:
            try:
                row = await conn.fetchrow(self._sql["read_mark"], timeout=self.timeout)
            except asyncpg.UndefinedTableError:
                return NO_MARK
            self._last_used = time.monotonic()
            return NO_MARK if row is None else TargetMark(row["owner"], int(row["seq"]))

        return self._reading(lambda: self._repeatable(fetch), "a mark read")

    def read_by_keys(self, keys: Sequence[Key]) -> Sequence[TargetRow]:
        """Every row whose (tenant, source_lead_id) is one of ``keys``, whatever its
        write_id, in one statement."""
        tenants = [tenant for tenant, _ in keys]
        lead_ids = [lead_id for _, lead_id in keys]

        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            rows = await conn.fetch(self._sql["read_by_keys"], tenants, lead_ids,
                                    timeout=self.timeout)
            self._last_used = time.monotonic()
            return list(rows)

        return [_target_row(row) for row in self._reading(
            lambda: self._repeatable(fetch), "a read by keys")]

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return self.read_back_many([write_id])

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        """Every row of these write_ids, in one statement, typed as stored (``is_test`` a
        bool, ``contact_alias`` None or a str: the shape check holds them to it)."""
        return [_target_row(row) for row in self._fetch("read_rows", write_ids, "a readback")]

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        for write_id, status in self._fetch("read_statuses", write_ids, "a status read"):
            if write_id in found:
                found[write_id].append(status)
        return {write_id: observe_rows(statuses) for write_id, statuses in found.items()}
