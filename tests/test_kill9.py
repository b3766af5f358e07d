"""kill -9 accounting in CI (issue 8.2), on both backends: a smaller seeded variant of
``python bench/kill9.py --runs 20 --leads 1000 --seed 9`` (``--backend postgres``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg
from tests.helpers import ROOT

RUNS = {"sqlite": 4, "postgres": 2}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill9_accounting_loses_and_duplicates_nothing(tmp_path: Path, backend: str) -> None:
    runs = RUNS[backend]
    report = tmp_path / "kill9.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kill9.py"), "--runs", str(runs), "--leads",
         "300", "--seed", "9", "--json", str(report), "--backend", backend,
         "--pg-dsn", pg.dsn()],
        capture_output=True, text=True, timeout=580, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["runs"] == runs
    for run in doc["results"]:
        assert (run["lost"], run["duplicated"], run["unexpected"]) == (0, 0, 0), run
        assert run["confirmed"] + run["uncertain"] == run["leads"]
        assert run["violations"] == []
    assert sum(run["kills"] for run in doc["results"]) >= runs
