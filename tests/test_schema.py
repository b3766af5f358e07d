"""Versioned migrations (K2): a newer store is refused untouched."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from runner.io.sqlite import schema
from tests.helpers import event, run_cli, write_json


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_store_from_a_newer_schema_is_refused_untouched(workdir: Path, scope_file: Path) -> None:
    db = workdir / "queue.db"
    rec = write_json(workdir / "e.json", event(1))
    assert run_cli("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    conn.commit()
    conn.close()
    before = digest(db)
    for argv in (("accept", "--db", db, "--scope", scope_file, "--record", rec),
                 ("status", "--db", db)):
        proc = run_cli(*argv)
        assert proc.returncode == 78, proc.stderr
        assert "newer runner" in proc.stderr
    assert digest(db) == before
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0


def test_migrations_are_append_only_and_numbered() -> None:
    assert sorted(schema.MIGRATIONS) == list(range(1, schema.LATEST + 1))
    assert schema.pending(0)[0][0] == 1
    assert schema.pending(schema.LATEST) == []
