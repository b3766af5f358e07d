"""The chaos runner in CI (issue 8.1): a seeded N=50 run of real crashed workers.

The full run is the documented command ``python bench/chaos.py --runs 1000 --seed 8``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.crashpoints import POINTS
from tests.helpers import ROOT

RUNS, SEED = 50, 8


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_seeded_50_runs_keep_every_invariant(tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--runs", str(RUNS), "--seed",
         str(SEED), "--jobs", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=880, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["runs"] == RUNS and doc["violations"] == []
    assert set(doc["points"]) == set(POINTS) and all(doc["points"].values())
    assert "result: PASS" in proc.stdout
