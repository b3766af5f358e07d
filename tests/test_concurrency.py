"""Several real processes writing one store at once (issue 2 point 8, K9)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


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


def test_four_processes_accept_1000_distinct_events(workdir: Path) -> None:
    db = workdir / "queue.db"
    go = workdir / "go"
    procs = [spawn(str(db), str(k * 250), str((k + 1) * 250), str(go)) for k in range(4)]
    go.touch()  # all four create the store and write at once
    results = finish(procs)
    for code, stdout, stderr in results:
        assert code == 0, stderr
        assert "locked" not in stderr.lower()
        assert json.loads(stdout) == {"accepted": 250}
    conn = sqlite3.connect(db)
    try:
        keys = [k for (k,) in conn.execute("SELECT source_lead_id FROM leads")]
        outbox = conn.execute("SELECT count(*) FROM outbox WHERE kind='accepted'").fetchone()[0]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert len(keys) == 1000 and len(set(keys)) == 1000
    assert set(keys) == {f"lead-{i}" for i in range(1000)}
    assert outbox == 1000


def test_overlapping_accepts_of_the_same_events_store_each_once(workdir: Path) -> None:
    db = workdir / "queue.db"
    go = workdir / "go"
    procs = [spawn(str(db), "0", "200", str(go)) for _ in range(3)]
    go.touch()
    results = finish(procs)
    totals: dict[str, int] = {}
    for code, stdout, stderr in results:
        assert code == 0, stderr
        for k, v in json.loads(stdout).items():
            totals[k] = totals.get(k, 0) + v
    assert totals == {"accepted": 200, "duplicate": 400}
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*) FROM leads").fetchone()[0] == 200
        assert conn.execute("SELECT count(DISTINCT write_id) FROM leads").fetchone()[0] == 200
    finally:
        conn.close()


def test_two_processes_creating_a_new_store_end_with_one_store(workdir: Path) -> None:
    for round_ in range(5):
        db = workdir / f"new-{round_}.db"
        go = workdir / f"go-{round_}"
        procs = [spawn(str(db), "0", "1", str(go)) for _ in range(2)]
        go.touch()
        results = finish(procs)
        assert all(code == 0 for code, _, _ in results), results
        answers = sorted(stdout.strip() for _, stdout, _ in results)
        assert answers == ['{"accepted": 1}', '{"duplicate": 1}']
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1
            assert conn.execute("SELECT count(*) FROM meta WHERE key='scope'").fetchone()[0] == 1
            assert conn.execute("SELECT count(*) FROM leads").fetchone()[0] == 1
        finally:
            conn.close()
