"""Opening a PostgreSQL store: the session, error translation, migrations, the scope pin.

Every session runner opens names itself (``application_name = runner pid=<pid> host=…``),
so a refused worker can say which process holds the lock and an operator can find runner
in ``pg_stat_activity``.  Sessions ask the server for TCP keepalives, so a client that
vanished (crash of its host, network partition) is noticed and its session, with the
locks it held, ends within about ``KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT``
seconds; ``idle_session_timeout`` is switched off for runner's sessions, because a
worker holds its lock session idle on purpose for the whole run.

Every transaction is bounded (issue 30): ``idle_in_transaction_session_timeout``
(``IDLE_IN_TRANSACTION_TIMEOUT``, or the DSN's own parameter of that name) makes the
server end a session left idle inside a transaction, so a process stopped there (SIGSTOP,
Ctrl-Z, a debugger) holds its row locks for that long at most instead of blocking every
``accept`` until its own statement timeout.  The stopped process, when it goes on, meets
``ConnectionLost`` (exit 74).  A read snapshot takes a longer bound (``READ_IDLE_TIMEOUT``)
for itself: it holds no row lock.

Errors are translated where they enter (:func:`translate`): an unreachable server is
``StoreUnreachable``, a session that ended under a command ``ConnectionLost``, a
read-only server (a standby, or no writable host of a multi-host DSN) ``StoreReadOnly``,
all exit 74 with one line naming the location (never its password).

Creating or upgrading a store is one transaction under ``pg_advisory_xact_lock`` keyed by
the schema: two processes opening a new database at once queue on that lock, and the
second sees the first one's committed schema and scope (K9).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from typing import TYPE_CHECKING

import anyio
import asyncpg

from runner.errors import (
    AccessDenied,
    ConfigMismatch,
    ConnectionLost,
    RunnerError,
    SchemaTooNew,
    StoreError,
    StoreFull,
    StoreNotFound,
    StoreReadOnly,
    StoreUnavailable,
    StoreUnreachable,
    UsageError,
)
from runner.io.postgres import schema
from runner.io.postgres.dsn import PgLocation
from runner.storedata import ScopeData, check_scope

if TYPE_CHECKING:
    from runner.storedata import WantedScope

CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
#: no runner statement should take this long; a dead or partitioned server surfaces as
#: an error (exit 74) instead of a worker hanging on it
COMMAND_TIMEOUT = 60.0
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
#: the server ends a session of runner's that stays idle inside a transaction this long
#: (issue 30): runner's writing transactions run their statements back to back, so only a
#: stopped (SIGSTOP, a debugger) or wedged process stays there, and the row locks it holds
#: would otherwise block every ``accept``.  A DSN parameter of that name wins.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
#: a read snapshot (``reading()``: ``status --records`` into a pager, a metrics scrape)
#: holds no row lock, so it may idle longer before the server ends it
READ_IDLE_TIMEOUT = "10min"
IDLE_SETTING = "idle_in_transaction_session_timeout"

#: connection-level failures: the session is gone, whatever the statement was
_LOST = (
    asyncpg.exceptions.PostgresConnectionError,  # class 08
    asyncpg.exceptions.OperatorInterventionError,  # class 57: terminated, shutting down
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # 25P03: the server ended it
    asyncpg.exceptions.InterfaceError,  # "connection is closed" and its kin
    # a session the server ended while it was idle can leave the driver's protocol in a
    # state it refuses to leave: the session is gone all the same
    asyncpg.exceptions.InternalClientError,
)
_DENIED = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # 28000: no such role, hba
    asyncpg.exceptions.InvalidPasswordError,  # 28P01
    asyncpg.exceptions.InsufficientPrivilegeError,  # 42501
)


def application_name() -> str:
    host = socket.gethostname().split(".")[0][:30]
    return f"runner pid={os.getpid()} host={host}"


def stable_key(*parts: str) -> int:
    """A stable signed 64-bit advisory lock key (the same on every host and release)."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _several(where: str) -> bool:
    return "," in where.split("/", 1)[0]


def translate(exc: BaseException, doing: str, where: str) -> RunnerError:
    """A driver or socket error as one of ours (never leak asyncpg exceptions to the CLI)."""
    if isinstance(exc, RunnerError):
        return exc
    if isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError) and isinstance(
            exc.__cause__, asyncpg.exceptions.IdleInTransactionSessionTimeoutError):
        exc = exc.__cause__  # the server said why it ended the session, then closed it
    if isinstance(exc, _DENIED):
        return AccessDenied(f"PostgreSQL at {where} refused access while {doing}: "
                            f"{_one_line(str(exc))}")
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return StoreNotFound(f"PostgreSQL at {where}: {_one_line(str(exc))} (runner creates "
                             "its schema and tables, not the database: create it first)")
    if isinstance(exc, asyncpg.exceptions.ClientConfigurationError):
        return UsageError(f"bad PostgreSQL DSN: {_one_line(str(exc))}")
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):  # 57014, before class 57
        return StoreError(f"PostgreSQL at {where} cancelled a statement while {doing} "
                          f"(statement_timeout, or a cancel request): {_one_line(str(exc))}")
    if isinstance(exc, asyncpg.exceptions.CannotConnectNowError):  # 57P03, before class 57
        return StoreUnreachable(f"PostgreSQL at {where} is not taking connections now "
                                f"({_one_line(str(exc))}) while {doing}; try again")
    if isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched):
        return StoreReadOnly(f"PostgreSQL at {where} does not match the DSN's "
                             "target_session_attrs (read-only where writes are asked for: a "
                             f"standby, or a failover not done yet) while {doing}; nothing "
                             "was written")
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):  # 25006
        hint = ("" if _several(where) else
                "; for a primary and its standbys, name every host in the DSN with "
                "target_session_attrs=read-write")
        return StoreReadOnly(f"PostgreSQL at {where} is read-only (a standby?) while "
                             f"{doing}: nothing was written{hint}")
    if isinstance(exc, asyncpg.exceptions.IdleInTransactionSessionTimeoutError):
        return ConnectionLost(
            f"PostgreSQL at {where} ended runner's session, idle inside a transaction for "
            f"longer than {IDLE_SETTING} (was this process stopped?), while {doing}: the "
            "transaction was rolled back")
    if isinstance(exc, _LOST):
        detail = ("the session has ended" if isinstance(
            exc, asyncpg.exceptions.InternalClientError) else _one_line(str(exc)))
        return ConnectionLost(f"lost the connection to PostgreSQL at {where} while {doing}: "
                              f"{detail}")
    if isinstance(exc, asyncpg.exceptions.DiskFullError):
        return StoreFull(f"the store is full (PostgreSQL at {where}, while {doing}: "
                         f"{_one_line(str(exc))}): the change was not written; free some "
                         "disk space on the server and run the command again")
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        return StoreUnavailable(f"PostgreSQL at {where} has no free connection slot; "
                                "try again")
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):  # a standby now
        return StoreUnavailable(f"PostgreSQL at {where} is read-only (a standby, or a "
                                f"primary that was demoted) while {doing}")
    if isinstance(exc, asyncpg.exceptions.PostgresError):
        return StoreError(f"PostgreSQL error while {doing}: {_one_line(str(exc))} "
                          f"(SQLSTATE {exc.sqlstate})")
    if isinstance(exc, ConnectionRefusedError):
        return StoreUnreachable(f"cannot reach PostgreSQL at {where}: connection refused")
    if isinstance(exc, TimeoutError):
        if doing == "connecting":
            return StoreUnreachable(f"cannot reach PostgreSQL at {where}: no answer in time")
        return StoreUnavailable(f"PostgreSQL at {where} did not answer in time while "
                                f"{doing}")
    if isinstance(exc, socket.gaierror):
        return StoreUnreachable(f"cannot reach PostgreSQL at {where}: unknown host")
    if isinstance(exc, OSError):
        reason = exc.strerror or type(exc).__name__
        if doing == "connecting":
            return StoreUnreachable(f"cannot reach PostgreSQL at {where}: {reason}")
        return ConnectionLost(f"lost the connection to PostgreSQL at {where} while {doing}: "
                              f"{reason}")
    if isinstance(exc, ValueError):  # a malformed DSN (bad port, bad option value)
        return UsageError(f"bad PostgreSQL DSN: {_one_line(str(exc))}")
    return StoreError(f"PostgreSQL error while {doing}: {type(exc).__name__}")


TRANSLATED = (OSError, TimeoutError, ValueError, asyncpg.exceptions.PostgresError,
              asyncpg.exceptions.InterfaceError, asyncpg.exceptions.InternalClientError)


def session_settings(loc: PgLocation) -> dict[str, str]:
    """What every session of runner's asks the server for at connect: its name,
    keepalives, and the idle-in-transaction bound (unless the DSN gives its own)."""
    settings = {
        "application_name": application_name(),
        "tcp_keepalives_idle": str(KEEPALIVE_IDLE),
        "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL),
        "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    }
    if IDLE_SETTING not in loc.params:
        settings[IDLE_SETTING] = IDLE_IN_TRANSACTION_TIMEOUT
    return settings


#: errors that end a connect attempt for every host (the next one would say the same)
_FINAL = (*_DENIED, asyncpg.exceptions.InvalidCatalogNameError,
          asyncpg.exceptions.ClientConfigurationError, ValueError)


async def connect(loc: PgLocation) -> asyncpg.Connection:
    """A session named after this process, with keepalives, no idle timeout and a
    bounded idle-in-transaction time, on the first host of ``loc`` that answers and
    matches its ``target_session_attrs`` (each host within its own connect timeout)."""
    settings = session_settings(loc)
    timeout = loc.connect_timeout or CONNECT_TIMEOUT
    attempts = loc.hosts or (("", loc.dsn),)
    if loc.session_attrs == "prefer-standby" and len(attempts) > 1:
        attempts = (("", loc.dsn),)  # asyncpg's own choice among every host that answers
    failed: list[tuple[str, BaseException]] = []
    for label, dsn in attempts:
        try:
            conn = await asyncpg.connect(dsn, timeout=timeout, command_timeout=COMMAND_TIMEOUT,
                                         server_settings=settings)
        except _FINAL as exc:
            raise translate(exc, "connecting", loc.where) from None
        except TRANSLATED as exc:
            failed.append((label, exc))
            continue
        try:
            if conn.get_server_version().major >= 14:
                await conn.execute("SET idle_session_timeout = 0")
        except BaseException as exc:
            conn.terminate()
            if isinstance(exc, TRANSLATED):
                raise translate(exc, "connecting", loc.where) from None
            raise
        return conn
    if len(failed) == 1:
        raise translate(failed[0][1], "connecting", loc.where) from None
    raise _no_host(loc, failed) from None


def _no_host(loc: PgLocation, failed: list[tuple[str, BaseException]]) -> RunnerError:
    """Every host of a multi-host DSN failed: one line saying what each one answered."""
    said = "; ".join(f"{label}: {_host_failure(exc, loc)}" for label, exc in failed)
    if any(isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched)
           for _, exc in failed):
        return StoreReadOnly(f"no host of PostgreSQL at {loc.where} gave a session for "
                             f"target_session_attrs={loc.session_attrs} ({said}); nothing "
                             "was written")
    return StoreUnreachable(f"no host of PostgreSQL at {loc.where} gave a session ({said})")


def _host_failure(exc: BaseException, loc: PgLocation) -> str:
    if isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched):
        return {"read-write": "read-only", "primary": "a standby",
                "standby": "not a standby", "read-only": "not read-only"}.get(
                    loc.session_attrs or "", "no match")
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {loc.connect_timeout or CONNECT_TIMEOUT:g} s"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, asyncpg.exceptions.PostgresError):
        return _one_line(str(exc))
    return type(exc).__name__


async def close_quietly(conn: asyncpg.Connection) -> None:
    """Close a session that may already be dead; the original error is what matters.

    Shielded and bounded: a cancelled worker still ends its sessions (so the server
    releases its lock at once), and a dead server cannot keep it waiting."""
    with (anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT),
          contextlib.suppress(*TRANSLATED)):
        await conn.close(timeout=CLOSE_TIMEOUT)
    if not conn.is_closed():
        conn.terminate()


_PROBE = """
SELECT n.oid IS NOT NULL AS has_schema,
       EXISTS (SELECT 1 FROM pg_catalog.pg_class c
               WHERE c.relnamespace = n.oid AND c.relname = 'schema_migrations') AS runner,
       (SELECT count(*) FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid) AS objects
FROM (SELECT 1) AS one
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1
"""


async def schema_exists(conn: asyncpg.Connection, loc: PgLocation) -> bool:
    probe = await conn.fetchrow(_PROBE, loc.schema)
    return bool(probe is not None and probe["has_schema"])


async def _read_version(conn: asyncpg.Connection, loc: PgLocation) -> int | None:
    """The store's schema version; 0 for a new store (no schema, or an empty one);
    None when the schema does not exist."""
    probe = await conn.fetchrow(_PROBE, loc.schema)
    assert probe is not None
    if not probe["has_schema"]:
        return None
    if not probe["runner"]:
        if probe["objects"]:
            raise StoreError(f"schema {loc.schema!r} at {loc.where} holds tables that are "
                             "not a runner store; choose another with ?schema=")
        return 0
    sql = schema.render("SELECT coalesce(max(version), 0) FROM {s}.schema_migrations",
                        loc.schema_ident)
    version = int(await conn.fetchval(sql))
    if version > schema.LATEST:
        raise SchemaTooNew(
            f"store schema v{version} was written by a newer runner (this one knows "
            f"v{schema.LATEST}); upgrade runner, the store was left untouched"
        )
    return version


async def _pinned_scope(conn: asyncpg.Connection, loc: PgLocation) -> ScopeData | None:
    sql = schema.render("SELECT value FROM {s}.meta WHERE key = 'scope'", loc.schema_ident)
    value = await conn.fetchval(sql)
    if value is None:
        return None
    return {str(k): str(v) for k, v in json.loads(value).items()}


async def migrate_and_pin(
    conn: asyncpg.Connection, loc: PgLocation, scope: WantedScope | None
) -> tuple[int, ScopeData | None]:
    """Create/upgrade the schema and pin the scope in one transaction (K2, K9)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)",
                           stable_key("runner.migrate", loc.schema))
        version = await _read_version(conn, loc)
        if version is None:
            await conn.execute(schema.render(schema.CREATE_SCHEMA, loc.schema_ident))
        if not version:
            await conn.execute(schema.render(schema.BOOTSTRAP, loc.schema_ident))
        for target, ddl in schema.pending(version or 0):
            await conn.execute(schema.render(ddl, loc.schema_ident))
            await conn.execute(schema.render(
                "INSERT INTO {s}.schema_migrations (version) VALUES ($1)", loc.schema_ident),
                target)
        pinned = await _pinned_scope(conn, loc)
        check_scope(pinned, scope)
        if pinned is None and scope is not None:
            await conn.execute(schema.render(
                "INSERT INTO {s}.meta (key, value) VALUES ('scope', $1)", loc.schema_ident),
                scope.model_dump_json())
            pinned = scope.model_dump()
    return schema.LATEST, pinned


async def inspect(
    conn: asyncpg.Connection, loc: PgLocation, scope: WantedScope | None
) -> tuple[int, ScopeData | None]:
    """Read-only open: check version and scope, write nothing."""
    version = await _read_version(conn, loc)
    if not version:
        raise StoreNotFound(f"no store in schema {loc.schema!r} at {loc.where}")
    if version < schema.LATEST:
        raise ConfigMismatch(
            f"store schema v{version} is older than this runner's v{schema.LATEST}; "
            "a writing command (accept, once, start) upgrades it"
        )
    pinned = await _pinned_scope(conn, loc)
    check_scope(pinned, scope)
    return version, pinned
