"""What a soak run (``bench/soak.py``) measures from outside the worker: a process's
resident set and open file descriptors (``/proc``), file sizes, and on PostgreSQL each
table's size and rows; and the ``VACUUM`` it runs after a retention pass when the
server's autovacuum is off."""

from __future__ import annotations

import os
from pathlib import Path


def proc_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def size_mib(*paths: Path) -> float:
    return sum(p.stat().st_size for p in paths if p.exists()) / (1 << 20)


def vacuum_without_autovacuum(location: str) -> bool:
    """``VACUUM`` the store's tables when the server's autovacuum is off (what it would
    do); True if it ran."""
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> bool:
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            if await conn.fetchval("SHOW autovacuum") == "on":
                return False
            tables = await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
                where.schema)
            for (name,) in tables:
                await conn.execute(f"VACUUM {where.schema_ident}.\"{name}\"")
            return True
        finally:
            await conn.close()

    return asyncio.run(go())


def relation_sizes(location: str) -> dict[str, dict[str, float]]:
    """Each table of the store's schema: MiB of heap (with TOAST) and of indexes, live and
    dead rows (the server's statistics), largest first."""
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> dict[str, dict[str, float]]:
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            rows = await conn.fetch(
                "SELECT c.relname, pg_total_relation_size(c.oid) - pg_indexes_size(c.oid), "
                "pg_indexes_size(c.oid), coalesce(s.n_live_tup, 0), "
                "coalesce(s.n_dead_tup, 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE n.nspname = $1 AND c.relkind = 'r' "
                "ORDER BY pg_total_relation_size(c.oid) DESC", where.schema)
        finally:
            await conn.close()
        mib = 1024 * 1024
        return {str(name): {"heap_mib": round(heap / mib, 2), "index_mib": round(index / mib, 2),
                            "live_rows": int(live), "dead_rows": int(dead)}
                for name, heap, index, live, dead in rows}

    return asyncio.run(go())
