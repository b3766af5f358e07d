"""Opening a SQLite store: file checks, pragmas, migrations, the scope pin.

Why an autocommit connection with explicit ``BEGIN IMMEDIATE``: Python's implicit
transactions start lazily and as DEFERRED, and a deferred transaction that reads and then
writes can fail with ``SQLITE_BUSY`` without waiting for the busy timeout when another
writer committed in between.  ``BEGIN IMMEDIATE`` takes the write lock first, so the busy
timeout applies and concurrent writers queue instead of failing.  A single write
statement outside a transaction is equally safe: SQLite starts it as a write transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING

import aiosqlite
import anyio

from runner.errors import (
    ConfigMismatch,
    RunnerError,
    SchemaTooNew,
    StoreBusy,
    StoreError,
    StoreFull,
    StoreNotFound,
)
from runner.io import fsguard
from runner.io.sqlite import schema
from runner.storedata import ScopeData, check_scope

if TYPE_CHECKING:
    from runner.storedata import WantedScope


BUSY_TIMEOUT_MS = 30_000
#: how long closing a connection may take under a shield
CLOSE_TIMEOUT = 5.0
#: the page cache per connection (SQLite's default is 2 MiB): a large inbox's indexes
#: stay in memory instead of being read back page by page (write_ids are time-ordered:
#: a larger cache did not help accept at 1M leads, see bench/accept_scale.py)
CACHE_KIB = 32 * 1024
MIN_SQLITE = (3, 37, 0)  # STRICT tables; RETURNING needs 3.35
SQLITE_IOERR, SQLITE_FULL = 10, 13  # primary result codes
#: below this much free space on the store's device, an I/O error is reported as "full"
LOW_SPACE = 1 << 20
#: test hook, like ``RUNNER_MOUNTINFO``: cap the store at this many pages (``PRAGMA
#: max_page_count``) so a test can make SQLite run out of space without a small disk
MAX_PAGES_ENV = "RUNNER_SQLITE_MAX_PAGES"
FULL_ADVICE = "the change was not written; free some disk space and run the command again"


def _free_bytes(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        info = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def translate(exc: BaseException, doing: str, path: str | None = None) -> RunnerError:
    """A driver error as one of ours (never leak sqlite3 exceptions to the CLI).

    A full store is named as such: ``SQLITE_FULL`` (the file or ``max_page_count`` cannot
    grow), or an I/O error while the store's device has no space left (SQLite reports a
    failure to size its ``-shm`` file on a full disk as a plain I/O error)."""
    if isinstance(exc, RunnerError):
        return exc
    text = str(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return StoreBusy(f"store stayed locked for {BUSY_TIMEOUT_MS // 1000} s while "
                         f"{doing}{_busy_cause(path)}; try again")
    if primary == SQLITE_FULL or "database or disk is full" in text:
        return StoreFull(f"the store is full ({doing}): {FULL_ADVICE}")
    if primary == SQLITE_IOERR or "disk I/O error" in text:
        free = _free_bytes(path)
        if free is not None and free < LOW_SPACE:
            return StoreFull(f"the store is full ({doing}: {text}, {free} bytes free on its "
                             f"device): {FULL_ADVICE}")
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return StoreError(f"store file is not a SQLite database ({doing})")
    return StoreError(f"store error while {doing}: {text}")


def split_script(script: str) -> Iterator[str]:
    """Split DDL into complete statements (triggers hold ';' inside BEGIN…END)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            buffer = ""
            if statement:
                yield statement
    if buffer.strip():
        raise ValueError("incomplete SQL statement in migration")


def _check_sqlite_version() -> None:
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old; runner needs "
            f"{'.'.join(map(str, MIN_SQLITE))} or newer"
        )


async def connect(path: str, *, create: bool, cache_kib: int | None = None
                  ) -> aiosqlite.Connection:
    """Open the file with runner's pragmas; nothing is created unless ``create``.  A file
    that is not a runner store, or was written by a newer runner, is refused before any
    pragma that writes (WAL), so it is left byte for byte as it was."""
    _check_sqlite_version()
    uri = f"file:{path}?mode={'rwc' if create else 'rw'}"
    try:
        # shielded: a connect abandoned by a cancel would leave its thread running, to
        # answer a closed event loop; opening a file does not wait on locks
        with anyio.CancelScope(shield=True):
            conn = await aiosqlite.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise translate(exc, "opening the store", path) from None
    try:
        await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # refuse a file that is not a runner store (or is a newer one) before anything
        # changes it: switching to WAL rewrites the file's header
        _check_header(*await _read_header(conn), path)
        await _enable_wal(conn)
        for pragma in _pragmas(cache_kib or CACHE_KIB):
            await conn.execute(pragma)
    except BaseException as exc:
        await close_quietly(conn)
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, "opening the store", path) from None
        raise
    return conn


async def close_quietly(conn: aiosqlite.Connection) -> None:
    """Close a connection, also when the caller is being cancelled (shielded, bounded):
    otherwise its thread outlives the event loop and a transaction it holds keeps the
    store locked until the process ends.  The original error is what matters."""
    with (anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT),
          contextlib.suppress(sqlite3.Error, ValueError)):
        await conn.close()


def _busy_cause(path: str | None) -> str:
    """Who is likely holding the store: the worker named by its lock file, and whether
    that process is stopped (SIGSTOP, Ctrl-Z), which holds a commit open until resumed."""
    from runner.io.filelock import holder

    found = holder(path) if path else None
    if found is None:
        return ""
    pid, state = found
    if state.startswith("stopped"):
        return (f" (worker pid {pid} holds the worker lock and is {state}: resume it with "
                f"`kill -CONT {pid}` or `fg` in its terminal)")
    return f" (worker pid {pid} holds the worker lock; it is {state})"


def _pragmas(cache_kib: int) -> list[str]:
    """What every connection to a store sets (after its busy timeout and WAL)."""
    pragmas = ["PRAGMA synchronous = FULL", f"PRAGMA cache_size = -{cache_kib}",
               "PRAGMA foreign_keys = ON"]
    if (max_pages := os.environ.get(MAX_PAGES_ENV, "").strip()).isdigit():
        pragmas.append(f"PRAGMA max_page_count = {int(max_pages)}")
    return pragmas


def open_blocking(path: str) -> sqlite3.Connection:
    """A second, blocking connection to an open store (already a WAL runner store), with
    the same pragmas, for the one thread that uses it (dispatch, see
    ``runner.store.DispatchSteps``).  Autocommit: each write statement is its own
    transaction, as on the main connection."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise translate(exc, "opening the store", path) from None
    try:
        for pragma in [f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}", *_pragmas(2048)]:
            conn.execute(pragma)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, "opening the store", path) from None
        raise
    return conn


async def _enable_wal(conn: aiosqlite.Connection) -> None:
    """Switch to WAL.  Changing the journal mode does not wait on the busy handler, so
    two processes opening a new store at once retry here instead of failing."""
    delay = 0.001
    with anyio.move_on_after(BUSY_TIMEOUT_MS / 1000):
        while True:
            try:
                rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            if rows and str(rows[0][0]).lower() == "wal":
                return
            raise StoreError("could not switch the store to WAL journaling")
    raise StoreBusy("store stayed locked while switching it to WAL; try again")


#: the three in one statement, so one read snapshot: read apart, another process's
#: store creation could commit between them (application id 0, then schema objects:
#: "not a runner store")
_HEADER = ("SELECT (SELECT user_version FROM pragma_user_version), "
           "(SELECT application_id FROM pragma_application_id), "
           "(SELECT count(*) FROM sqlite_master)")


async def _read_header(conn: aiosqlite.Connection) -> tuple[int, int, int]:
    """(user_version, application_id, number of schema objects), read consistently."""
    (version, app_id, objects) = next(iter(await conn.execute_fetchall(_HEADER)))
    return int(version), int(app_id), int(objects)


def _check_header(version: int, app_id: int, objects: int, path: str) -> None:
    if app_id not in (0, schema.APPLICATION_ID) or (app_id == 0 and objects > 0):
        raise StoreError(f"{path!r} is a SQLite database but not a runner store")
    if version > schema.LATEST:
        raise SchemaTooNew(
            f"store schema v{version} was written by a newer runner (this one knows "
            f"v{schema.LATEST}); upgrade runner, the store was left untouched"
        )


async def _pinned_scope(conn: aiosqlite.Connection) -> ScopeData | None:
    rows = list(await conn.execute_fetchall("SELECT value FROM meta WHERE key = 'scope'"))
    if not rows:
        return None
    data = json.loads(rows[0][0])
    return {str(k): str(v) for k, v in data.items()}


async def migrate_and_pin(
    conn: aiosqlite.Connection, path: str, scope: WantedScope | None
) -> tuple[int, ScopeData | None]:
    """Create/upgrade the schema and pin the scope in one ``BEGIN IMMEDIATE``."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        version, app_id, objects = await _read_header(conn)
        _check_header(version, app_id, objects, path)
        for target, ddl in schema.pending(version):
            for statement in split_script(ddl):
                await conn.execute(statement)
            await conn.execute(f"PRAGMA user_version = {target}")
        if version == 0:
            await conn.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
        pinned = await _pinned_scope(conn)
        check_scope(pinned, scope)
        if pinned is None and scope is not None:
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('scope', ?)",
                (scope.model_dump_json(),),
            )
            pinned = scope.model_dump()
        await conn.execute("COMMIT")
    except BaseException:
        await rollback_quietly(conn)
        raise
    return schema.LATEST, pinned


async def inspect(
    conn: aiosqlite.Connection, path: str, scope: WantedScope | None
) -> tuple[int, ScopeData | None]:
    """Read-only open: check version and scope, write nothing."""
    version, app_id, objects = await _read_header(conn)
    _check_header(version, app_id, objects, path)
    if version == 0:
        return 0, None
    if version < schema.LATEST:
        raise ConfigMismatch(
            f"store schema v{version} is older than this runner's v{schema.LATEST}; "
            "a writing command (accept, once, start) upgrades it"
        )
    pinned = await _pinned_scope(conn)
    check_scope(pinned, scope)
    return version, pinned


async def rollback_quietly(conn: aiosqlite.Connection) -> None:
    if conn.in_transaction:
        # the transaction may already be gone; the original error is what matters
        with contextlib.suppress(sqlite3.Error):
            await conn.execute("ROLLBACK")


def prepare_path(location: str, *, create: bool) -> str:
    path = fsguard.prepare_store_path(location, create=create)
    if not create and not os.path.exists(path):
        raise StoreNotFound(f"no store at {location!r}")
    return path

