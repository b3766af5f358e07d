"""kill -9 of a serving process under signed load, in CI (issue 18 point 6), on both
backends: a smaller seeded variant of ``python bench/kill9_http.py --runs 10 --leads 600``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg
from tests.helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_request_answered_200_is_stored_once(tmp_path: Path, backend: str) -> None:
    report = tmp_path / "kill9-http.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kill9_http.py"), "--runs", "2", "--leads",
         "200", "--seed", "18", "--json", str(report), "--backend", backend,
         "--pg-dsn", pg.dsn()],
        capture_output=True, text=True, timeout=580, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["runs"] == 2
    for run in doc["results"]:
        assert (run["lost"], run["twice"], run["duplicated"], run["wrong"]) == (0, 0, 0, 0)
        assert run["kills"] >= 1 and run["answered"] >= run["leads"]
        assert run["confirmed"] + run["uncertain"] == run["leads"]
        assert run["violations"] == []
