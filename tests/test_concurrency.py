"""Several real processes writing one store at once (issue 2 point 8, issue 6 point 4, K9),
on every backend."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests import pg
from tests.helpers import ROOT, read_store


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs.accept_many", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append((p.returncode, stdout, stderr))
    return out


def outbox_seqs(db: str) -> list[int]:
    if pg.is_pg(db):
        return [s for (s,) in pg.fetch(f'SELECT seq FROM "{pg.schema_of(db)}".outbox ORDER BY seq')]
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [s for (s,) in conn.execute("SELECT seq FROM outbox ORDER BY seq")]
    finally:
        conn.close()


def test_four_processes_accept_1000_distinct_events(db_location: str, workdir: Path) -> None:
    go = workdir / "go"
    procs = [spawn(db_location, str(k * 250), str((k + 1) * 250), str(go)) for k in range(4)]
    go.touch()  # all four create the store and write at once
    results = finish(procs)
    for code, stdout, stderr in results:
        assert code == 0, stderr
        assert "locked" not in stderr.lower()
        assert json.loads(stdout) == {"accepted": 250}
    summary, records = read_store(db_location)
    keys = [r.source_lead_id for r in records]
    assert len(keys) == 1000 and len(set(keys)) == 1000
    assert set(keys) == {f"lead-{i}" for i in range(1000)}
    assert len({r.write_id for r in records}) == 1000
    assert summary.outbox_by_kind == {"accepted": 1000}
    assert outbox_seqs(db_location) == list(range(1, 1001))  # gap-free, in commit order


def test_overlapping_accepts_of_the_same_events_store_each_once(
    db_location: str, workdir: Path
) -> None:
    go = workdir / "go"
    procs = [spawn(db_location, "0", "200", str(go)) for _ in range(3)]
    go.touch()
    results = finish(procs)
    totals: dict[str, int] = {}
    for code, stdout, stderr in results:
        assert code == 0, stderr
        for k, v in json.loads(stdout).items():
            totals[k] = totals.get(k, 0) + v
    assert totals == {"accepted": 200, "duplicate": 400}
    summary, records = read_store(db_location)
    assert len(records) == 200 and len({r.write_id for r in records}) == 200
    assert summary.outbox_by_kind == {"accepted": 200}


def test_two_processes_creating_a_new_store_end_with_one_store(
    new_location: Callable[[str], str], workdir: Path
) -> None:
    for round_ in range(5):
        db = new_location(f"new-{round_}")
        go = workdir / f"go-{round_}"
        procs = [spawn(db, "0", "1", str(go)) for _ in range(2)]
        go.touch()
        results = finish(procs)
        assert all(code == 0 for code, _, _ in results), results
        answers = sorted(stdout.strip() for _, stdout, _ in results)
        assert answers == ['{"accepted": 1}', '{"duplicate": 1}']
        summary, records = read_store(db)
        assert summary.schema_version >= 1 and summary.scope is not None
        assert len(records) == 1
        if pg.is_pg(db):
            schema = pg.schema_of(db)
            assert pg.fetch(f'SELECT count(*) FROM "{schema}".meta WHERE key = $1',
                            "scope") == [(1,)]
        else:
            conn = sqlite3.connect(db)
            try:
                assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1
                assert conn.execute(
                    "SELECT count(*) FROM meta WHERE key='scope'").fetchone()[0] == 1
            finally:
                conn.close()
