"""Shared helpers: synthetic fixtures and running the CLI as a real process."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN = str(ROOT / "run.py")

SCOPE: dict[str, str] = {
    "tenant_id": "tenant-synthetic-1",
    "account_id": "account-synthetic-1",
    "page_id": "page-synthetic-1",
    "form_id": "form-synthetic-1",
}

CANARY = "canary-alias-7f3e"  # a contact alias that must never appear in any output


def event(i: int | str = 1, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        **SCOPE,
        "source": "meta",
        "source_lead_id": f"lead-{i}",
        "synthetic": True,
        "contact_alias": f"alias-{i}",
    }
    doc.update(overrides)
    return doc


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def run_cli(
    *args: str | Path,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python run.py ARGS`` as a child process and return what it did."""
    full_env = {**os.environ, **(env or {})}
    data = input.decode() if isinstance(input, bytes) else input
    return subprocess.run(
        [sys.executable, RUN, *map(str, args)],
        input=data,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def last_json(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no JSON on stdout"
    return json.loads(lines[-1])


def dump_store(location: str | Path) -> list[str]:
    """A logical dump of a store on either backend, to prove that nothing changed."""
    from tests import pg

    if pg.is_pg(location):
        return pg.dump(str(location))
    return dump_db(Path(location))


def store_exists(location: str | Path) -> bool:
    from tests import pg

    if pg.is_pg(location):
        return pg.exists(str(location))
    return Path(location).exists()


def dump_db(path: Path) -> list[str]:
    """A logical dump of a SQLite file, to prove that nothing changed."""
    if not path.exists():
        return ["<absent>"]
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return [f"user_version={version}", *conn.iterdump()]
    finally:
        conn.close()


def read_store(location: str | Path) -> tuple[Any, list[Any]]:
    """(summary, records) of a store on either backend, read through the library."""
    from runner.store import open_store
    from tests import pg

    async def read() -> tuple[Any, list[Any]]:
        async with await open_store(str(location), create=False) as store, store.reading():
            return await store.summary(), [row async for row in store.iter_records()]

    return pg.run(read)
