"""The chaos runner (``bench/chaos.py``): real worker processes crashed at named points,
audited after every process, on SQLite and PostgreSQL.

The default run crashes once at every crash point (at its first hit, so each one must
fire) plus a small seeded random sample; ``pytest -m slow`` runs the seeded N=50 on
SQLite and N=28 on PostgreSQL.  The full run is the documented command
``python bench/chaos.py --runs 1000 --seed 8`` (``--backend postgres`` for the other
backend).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.crashpoints import POINTS
from tests import pg
from tests.helpers import ROOT

SEED = 8
#: random runs after the one-per-point runs of ``--every-point``, in the default run
SAMPLE = {"sqlite": 2, "postgres": 2}
#: the seeded random runs under ``-m slow``
RUNS = {"sqlite": 64, "postgres": 28}
#: the default run's episodes, one test each: on SQLite every crash point once (crashing
#: at its first hit) then the random sample; on PostgreSQL the random sample
EPISODES = [
    *[pytest.param("sqlite", i, id=f"sqlite-{point}") for i, point in enumerate(POINTS)],
    *[pytest.param(backend, len(POINTS) + k, id=f"{backend}-random-{k}")
      for backend in ("sqlite", "postgres") for k in range(SAMPLE[backend])],
]


def chaos(tmp_path: Path, backend: str, runs: int, *extra: str, timeout: float) -> Any:
    if backend == "postgres":
        pg.require()
    report = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--runs", str(runs),
         "--seed", str(SEED), "--jobs", "2", "--json", str(report), "--backend", backend,
         "--pg-dsn", pg.dsn(), *extra],
        capture_output=True, text=True, timeout=timeout, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["violations"] == []
    assert "result: PASS" in proc.stdout
    return doc


@pytest.mark.parametrize(("backend", "index"), EPISODES)
def test_a_crash_at_each_point_and_a_random_sample_keep_every_invariant(
    tmp_path: Path, backend: str, index: int
) -> None:
    doc = chaos(tmp_path, backend, SAMPLE[backend], "--every-point", "--only", str(index),
                timeout=100)
    assert doc["runs"] == 1
    if index < len(POINTS):  # a run at one point, crashing at its first hit: it fired
        assert doc["fired"] == 1 and doc["points"][list(POINTS)[index]] == 1, doc


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_seeded_runs_keep_every_invariant(tmp_path: Path, backend: str) -> None:
    doc = chaos(tmp_path, backend, RUNS[backend], timeout=880)
    assert doc["runs"] == RUNS[backend]
    if backend == "sqlite":  # every point dealt at least three times, and every one fired
        assert set(doc["points"]) == set(POINTS) and all(doc["points"].values())
