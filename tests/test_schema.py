"""Versioned migrations (K2): a newer store is refused untouched."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from runner.io.postgres import schema as pg_schema
from runner.io.sqlite import schema
from tests import pg
from tests.helpers import event, run_main, write_json


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_store_from_a_newer_schema_is_refused_untouched(
    workdir: Path, scope_file: Path, db_location: str
) -> None:
    if pg.is_pg(db_location):
        _newer_pg_schema_is_refused_untouched(workdir, scope_file, db_location)
        return
    db = Path(db_location)
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    conn.commit()
    conn.close()
    before = digest(db)
    for argv in (("accept", "--db", db, "--scope", scope_file, "--record", rec),
                 ("status", "--db", db)):
        proc = run_main(*argv)
        assert proc.returncode == 78, proc.stderr
        assert "newer runner" in proc.stderr
    assert digest(db) == before
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0


def _newer_pg_schema_is_refused_untouched(workdir: Path, scope_file: Path, db: str) -> None:
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    pg.execute(f'INSERT INTO "{pg.schema_of(db)}".schema_migrations (version) VALUES ($1)',
               pg_schema.LATEST + 1)
    before = pg.dump(db)
    for argv in (("accept", "--db", db, "--scope", scope_file, "--record", rec),
                 ("once", "--db", db, "--scope", scope_file, "--target", workdir / "t.db"),
                 ("status", "--db", db)):
        proc = run_main(*argv)
        assert proc.returncode == 78, proc.stderr
        assert "newer runner" in proc.stderr
    assert pg.dump(db) == before


def test_migrations_are_append_only_and_numbered() -> None:
    for module in (schema, pg_schema):
        assert sorted(module.MIGRATIONS) == list(range(1, module.LATEST + 1))
        assert module.pending(0)[0][0] == 1
        assert module.pending(module.LATEST) == []
    # one numbering for both backends: schema_version means the same on each
    assert pg_schema.LATEST == schema.LATEST


def test_the_sqlite_lead_guard_allows_exactly_its_transitions() -> None:
    """v16's guard (the allowed pairs found by ``instr`` in one delimited string, not an
    ``IN`` list) refuses and allows exactly what v9's did, for every pair of states."""
    from runner.leads.states import LeadState

    conn = sqlite3.connect(":memory:", isolation_level=None)
    for _, ddl in schema.pending(0):
        conn.executescript(ddl)
    allowed = set(schema.V9_TRANSITIONS)
    for i, (src, dst) in enumerate((a, b) for a in LeadState for b in LeadState if a != b):
        conn.execute("INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, state,"
                     " accepted_at, updated_at) VALUES ('t', ?, '{}', ?, ?, 'now', 'now')",
                     (f"lead-{i}", f"w-{i}", src.value))
        try:
            conn.execute("UPDATE leads SET state = ? WHERE write_id = ?", (dst.value, f"w-{i}"))
            found = "allowed"
        except sqlite3.IntegrityError as exc:
            found = str(exc)
        if (src, dst) == (LeadState.UNCERTAIN, LeadState.FAILED_SAFE):  # its own trigger
            assert "needs a recorded not-sent decision" in found
        elif (src, dst) in allowed:
            assert found == "allowed", (src, dst)
        else:
            assert found == "illegal lead transition", (src, dst)
    conn.close()


@pytest.mark.usefixtures("sqlite_only")
def test_a_real_v1_store_is_upgraded_in_place(workdir: Path, scope_file: Path) -> None:
    """A store written by the v1 runner (a file kept from that version) opens, keeps every
    record, gains the new columns and goes on working."""
    import shutil

    db = workdir / "queue.db"
    shutil.copy(Path(__file__).parent / "fixtures" / "store-v1.sqlite", db)
    db.chmod(0o600)
    status = run_main("status", "--db", db)
    assert status.returncode == 78 and "older" in status.stderr  # status never migrates
    rec = write_json(workdir / "e.json", event(1))  # already in the v1 store
    again = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["result"] == "duplicate"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST
        cols = [c[1] for c in conn.execute("PRAGMA table_info(leads)")]
        assert "reconcile_note" in cols
        keys = [k for (k,) in conn.execute("SELECT source_lead_id FROM leads ORDER BY seq")]
        assert keys == ["lead-1", "lead-2", "lead-3"]
    finally:
        conn.close()
    target = workdir / "target.db"
    once = run_main("once", "--db", db, "--scope", scope_file, "--target", target)
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["confirmed"] == 3
