"""The chaos runner in CI (issue 8.1): a seeded N=50 run of real crashed workers on
SQLite, and N=28 on PostgreSQL.

The full run is the documented command ``python bench/chaos.py --runs 1000 --seed 8``
(``--backend postgres`` for the other backend).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.crashpoints import POINTS
from tests import pg
from tests.helpers import ROOT

SEED = 8
RUNS = {"sqlite": 50, "postgres": 28}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_seeded_runs_keep_every_invariant(tmp_path: Path, backend: str) -> None:
    report = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--runs", str(RUNS[backend]),
         "--seed", str(SEED), "--jobs", "2", "--json", str(report), "--backend", backend,
         "--pg-dsn", pg.dsn()],
        capture_output=True, text=True, timeout=880, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["runs"] == RUNS[backend] and doc["violations"] == []
    assert "result: PASS" in proc.stdout
    if backend == "sqlite":  # every point dealt at least three times, and every one fired
        assert set(doc["points"]) == set(POINTS) and all(doc["points"].values())
