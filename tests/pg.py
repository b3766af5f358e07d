"""PostgreSQL for the tests: the server to use, isolated schemas, raw access.

The DSN comes from ``RUNNER_TEST_PG_DSN`` (default: this machine's server, trust auth,
database ``test``).  Each test gets a schema of its own (``?schema=t_…`` on the DSN, see
``runner.io.postgres.dsn``), dropped afterwards: much faster than a database per test.
When the server cannot be reached, PostgreSQL tests skip with the reason, unless
``RUNNER_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which makes that a failure.

Raw access runs asyncpg on a private event loop in a helper thread, so sync tests and
fixtures can use it while a test's own loop is running or not.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

DSN_ENV = "RUNNER_TEST_PG_DSN"
REQUIRE_ENV = "RUNNER_REQUIRE_POSTGRES"
DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"

T = TypeVar("T")


def dsn() -> str:
    return os.environ.get(DSN_ENV) or DEFAULT_DSN


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``await fn(*args)`` to completion on a fresh loop in a helper thread."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(fn(*args))  # type: ignore[arg-type]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


@cache
def availability() -> str | None:
    """None if the test server answers, else why not."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[dev,postgres]')"

    async def probe() -> None:
        conn = await asyncpg.connect(dsn(), timeout=5)
        await conn.close()

    try:
        run(probe)
    except Exception as exc:
        from runner.io.postgres.dsn import describe

        return f"PostgreSQL at {describe(dsn())} is unreachable ({DSN_ENV}): {exc}"
    return None


def require() -> None:
    """Skip (or, under RUNNER_REQUIRE_POSTGRES=1, fail) when the server is not there."""
    reason = availability()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


def location(schema: str, base: str | None = None) -> str:
    parts = urlsplit(base or dsn())
    query = [*parse_qsl(parts.query), ("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def schema_of(loc: str) -> str:
    return dict(parse_qsl(urlsplit(loc).query)).get("schema", "runner")


def is_pg(loc: str | os.PathLike[str]) -> bool:
    return str(loc).startswith(("postgresql://", "postgres://"))


async def _with_conn(fn: Callable[[Any], Awaitable[T]]) -> T:
    import asyncpg

    conn = await asyncpg.connect(dsn(), timeout=10)
    try:
        return await fn(conn)
    finally:
        await conn.close()


def execute(sql: str, *args: Any) -> None:
    run(_with_conn, lambda conn: conn.execute(sql, *args))


def fetch(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    async def go(conn: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await conn.fetch(sql, *args)]

    return run(_with_conn, go)


def drop_schemas(names: list[str]) -> None:
    if names:
        execute("; ".join(f'DROP SCHEMA IF EXISTS "{n}" CASCADE' for n in names))


#: the schemas the tests of this process made, dropped when it ends (``drop_later``)
_left: list[str] = []


def drop_later(names: list[str]) -> None:
    """Drop these schemas when the test process ends (``drop_left``), not now: a drop per
    test costs a connection and a catalog transaction of its own, about twice what the
    same drops cost in batches.  No test looks at schemas other than its own."""
    _left.extend(names)


def drop_left(batch: int = 8) -> None:
    """Drop the schemas ``drop_later`` kept, a batch per transaction (each drop locks
    every object of its schema, about 200: a batch of 8 stays far within the server's
    shared lock table, 6,400 slots by default, even with every test process dropping at
    once; batches of 25 exhausted it, "out of shared memory", for every other session of
    the server)."""
    while _left:
        names = _left[:batch]
        drop_schemas(names)
        del _left[:batch]


def exists(loc: str) -> bool:
    return bool(fetch("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema_of(loc)))


def dump(loc: str) -> list[str]:
    """Every row of every table of the store's schema, to prove that nothing changed
    (read over one connection)."""
    schema = schema_of(loc)

    async def go(conn: Any) -> list[str]:
        tables = [r[0] for r in await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY c.relname", schema)]
        if not tables:
            present = await conn.fetchval(
                "SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
            return ["<empty schema>"] if present else ["<absent>"]
        out = []
        for table in tables:
            out.append(f"-- {table}")
            rows = await conn.fetch(f'SELECT * FROM "{schema}"."{table}" ORDER BY 1')
            out += [repr(tuple(row)) for row in rows]
        return out

    return run(_with_conn, go)


def backend_pids(app_pid: int) -> list[int]:
    """Server backends of the runner process ``app_pid`` (by its application_name)."""
    return [p for (p,) in fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1",
        f"runner pid={app_pid} %")]


# --- a pool of empty stores (this test process's) -------------------------------------
#
# Creating a store's schema costs about 350 ms of DDL on this server; emptying a used one
# costs a few ms.  ``pooled_schema`` hands out a migrated, empty, unpinned store (exactly
# what ``migrate_and_pin`` makes before a scope is pinned); ``give_back`` empties it to
# the template's rows and keeps it for the next test of this process, unless the test
# changed its shape (tables, columns, triggers, functions, grants), left a session
# holding a lock on it, or anything else makes that doubtful: then it is dropped as any
# other.  Tests of store creation itself take a location with no schema
# (``new_location`` in conftest.py).

_TEMPLATE = "t_template"
_pool: list[str] = []
_template: dict[str, Any] = {}

_SHAPE = """
SELECT md5(coalesce(string_agg(x, E'\\n' ORDER BY x), '')) FROM (
  SELECT 'c ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.relacl::text, '')
         || ' ' || c.relpersistence::text AS x
  FROM pg_class c WHERE c.relnamespace = $1::regnamespace
  UNION ALL
  SELECT 'a ' || c.relname || ' ' || a.attnum::text || ' ' || a.attname || ' '
         || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' '
         || a.attidentity::text || ' '
         || replace(coalesce(pg_get_expr(d.adbin, d.adrelid), ''), $2, '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE c.relnamespace = $1::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'k ' || c.relname || ' ' || k.conname || ' '
         || replace(pg_get_constraintdef(k.oid), $2, '')
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
  WHERE c.relnamespace = $1::regnamespace
  UNION ALL
  SELECT 'i ' || replace(pg_get_indexdef(i.indexrelid), $2, '')
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
  WHERE c.relnamespace = $1::regnamespace
  UNION ALL
  SELECT 't ' || c.relname || ' ' || t.tgname || ' ' || t.tgenabled::text || ' '
         || replace(pg_get_triggerdef(t.oid), $2, '')
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
  UNION ALL
  SELECT 'p ' || p.proname || ' ' || md5(replace(p.prosrc, $2, '')) || ' '
         || coalesce(array_to_string(p.proconfig, ';'), '') || ' '
         || coalesce(p.proacl::text, '')
  FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
  UNION ALL
  SELECT 'n ' || coalesce(n.nspacl::text, '') || ' ' || n.nspowner::regrole::text
  FROM pg_namespace n WHERE n.oid = $1::regnamespace
) AS parts
"""


async def _shape(conn: Any, schema: str) -> str:
    return str(await conn.fetchval(_SHAPE, f'"{schema}"', schema))


async def _create(conn: Any, schema: str) -> None:
    from runner.io.postgres.connection import migrate_and_pin
    from runner.io.postgres.dsn import parse

    await migrate_and_pin(conn, parse(location(schema)), None)


async def _load_template(conn: Any) -> None:
    """This process's template: a new store's shape, the rows its migrations write and
    the statements that bring a used store back to them."""
    schema = f"{_TEMPLATE}_{uuid.uuid4().hex[:12]}"
    await _create(conn, schema)
    _left.append(schema)
    tables = [r[0] for r in await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace "
        "AND relkind = 'r' ORDER BY relname", f'"{schema}"')]
    sequences = [r[0] for r in await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace "
        "AND relkind = 'S' ORDER BY relname", f'"{schema}"')]
    filled = [t for t in tables
              if await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{schema}"."{t}")')]
    values = {s: tuple(await conn.fetchrow(
        f'SELECT last_value, is_called FROM "{schema}"."{s}"')) for s in sequences}
    _template.update(name=schema, shape=await _shape(conn, schema), tables=tables,
                     filled=filled, sequences=values)


def _reset_sql(schema: str) -> str:
    t, s = _template["name"], f'"{schema}"'
    parts = ["SET LOCAL lock_timeout = '2s'", "SET LOCAL session_replication_role = replica"]
    parts += [f'DELETE FROM {s}."{table}"' for table in _template["tables"]]
    parts += [f'INSERT INTO {s}."{table}" OVERRIDING SYSTEM VALUE SELECT * FROM "{t}"."{table}"'
              for table in _template["filled"]]
    parts += [f"SELECT setval('{s}.\"{seq}\"', {value}, {str(called).lower()})"
              for seq, (value, called) in _template["sequences"].items()]
    return "BEGIN; " + "; ".join(parts) + "; COMMIT"


def pooled_schema() -> str:
    """A schema holding a migrated, empty store with no scope pinned yet: from this
    process's pool, else made now."""
    if _pool:
        return _pool.pop()
    schema = new_schema()

    async def make(conn: Any) -> None:
        if not _template:
            await _load_template(conn)
        await _create(conn, schema)

    run(_with_conn, make)
    return schema


_HELD = """
SELECT count(*) FROM pg_locks l
WHERE l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = $1::regnamespace)
   OR (l.locktype = 'advisory' AND l.objsubid = 1  -- a bigint key: classid and objid
       AND ((l.classid::bigint << 32) | l.objid::bigint) = ANY($2::bigint[]))
"""


def give_back(schema: str) -> None:
    """Empty a used pooled schema and keep it for the next test of this process, or drop
    it later when it is not as the template left it."""
    from runner.io.postgres.lock import worker_lock_key

    async def reset(conn: Any) -> bool:
        if not _template or await _shape(conn, schema) != _template["shape"]:
            return False
        scope = await conn.fetchval(f'SELECT value FROM "{schema}".meta WHERE key = \'scope\'')
        keys = [worker_lock_key(schema, None)]
        if scope is not None:
            keys.append(worker_lock_key(schema, json.loads(scope)))
        if await conn.fetchval(_HELD, f'"{schema}"', keys):
            return False
        await conn.execute(_reset_sql(schema))
        return True

    try:
        kept = run(_with_conn, reset)
    except Exception:
        kept = False
    (_pool if kept else _left).append(schema)


def drop_pool() -> None:
    _left.extend(_pool)
    _pool.clear()
