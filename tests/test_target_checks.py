"""Issue 15 points 1 and 8: a misconfigured target never strands records, and a refusal
changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sqlite3
from pathlib import Path

import pytest

from runner.cli import main


def cli(*argv: str | Path) -> tuple[int, str, str]:
    """``runner.cli.main`` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_sqlite(path: Path, *, wal: bool = False) -> Path:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me as I am')")
    conn.commit()
    conn.close()
    path.chmod(0o600)
    return path



@pytest.mark.parametrize("wal", [False, True], ids=["rollback-journal", "wal"])
def test_a_foreign_sqlite_file_as_db_is_left_byte_for_byte(
    workdir: Path, scope_file: Path, wal: bool
) -> None:
    db = foreign_sqlite(workdir / "foreign.db", wal=wal)
    before, files = digest(db), sorted(os.listdir(workdir))
    code, out, err = cli("once", "--db", db, "--scope", scope_file, "--target",
                         workdir / "t.db")
    assert code == 74 and out == "" and "not a runner store" in err
    assert digest(db) == before  # the journal mode too: it is in the header
    assert sorted(os.listdir(workdir)) == files
