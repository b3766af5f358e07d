"""kill -9 accounting on both backends (``bench/kill9.py``): ``start`` SIGKILLed from
outside at random moments, restarted to completion; nothing lost, nothing duplicated.

The default run is a small seeded sample; ``pytest -m slow`` runs the larger one, itself a
smaller variant of the documented ``python bench/kill9.py --runs 20 --leads 1000 --seed 9``
(``--backend postgres``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg
from tests.helpers import ROOT

#: backend -> (runs, leads): the default run's sample, and the slow run's
SAMPLE = {"sqlite": (2, 150), "postgres": (1, 150)}
RUNS = {"sqlite": (3, 300), "postgres": (1, 300)}  # the CI budget; the bench runs more


def kill9(tmp_path: Path, backend: str, runs: int, leads: int, timeout: float,
          *extra: str) -> None:
    report = tmp_path / "kill9.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kill9.py"), "--runs", str(runs), "--leads",
         str(leads), "--seed", "9", "--json", str(report), "--backend", backend,
         "--pg-dsn", pg.dsn(), *extra],
        capture_output=True, text=True, timeout=timeout, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["runs"] == runs
    for run in doc["results"]:
        assert (run["lost"], run["duplicated"], run["unexpected"]) == (0, 0, 0), run
        assert run["confirmed"] + run["uncertain"] == run["leads"]
        assert run["violations"] == []
    assert sum(run["kills"] for run in doc["results"]) >= runs


@pytest.mark.timeout(300)
def test_a_sample_of_kill9_runs_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str
) -> None:
    kill9(tmp_path, backend, *SAMPLE[backend], timeout=280)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill9_accounting_loses_and_duplicates_nothing(tmp_path: Path, backend: str) -> None:
    kill9(tmp_path, backend, *RUNS[backend], timeout=580)


@pytest.mark.timeout(300)
def test_kill9_over_http_with_server_faults_loses_and_duplicates_nothing(
        tmp_path: Path) -> None:
    """Issue 17: the same accounting delivering to ``runner target-serve`` over loopback
    HTTP, with server faults (apply-then-drop, 429 storms, 5xx, late answers) drawn at
    random per run; the server's sheet is audited row by row."""
    kill9(tmp_path, "sqlite", 2, 150, 280, "--http-target")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [
    # a target that deduplicates by write_id: runner itself sends again every uncertain
    # record with no row, so nothing is left uncertain, with no operator command (E7)
    pytest.param(["--http-target", "--dedupe"], id="dedupe-http"),
    # the table target deduplicates by its primary key
    pytest.param(["--pg-table", pg.dsn()], id="pg-table"),
    # a target that cannot deduplicate: one resolve --all settles every record with no row
    pytest.param(["--settle"], id="settle"),
])
def test_kill9_at_the_default_batch_leaves_nothing_uncertain(
        tmp_path: Path, mode: list[str]) -> None:
    """Issue 29: kills at random moments while a worker sends batches of 1,000; at the
    end every record is confirmed (0 lost, 0 duplicated, 0 uncertain), without an
    operator command on a deduplicating target, and with one ``resolve --all`` on one that
    cannot deduplicate."""
    if "--pg-table" in mode:
        pg.require()
    report = tmp_path / "kill9.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kill9.py"), "--runs", "1", "--kills", "2",
         "--leads", "1200", "--max-delay", "0.2", "--seed", "29", "--json", str(report),
         *mode], capture_output=True, text=True, timeout=580, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    (run,) = doc["results"]
    assert (run["lost"], run["duplicated"], run["unexpected"], run["uncertain"]) == (
        0, 0, 0, 0), run
    assert run["confirmed"] == run["leads"] == 1200 and run["kills"] == 2
    assert run["operator_commands"] == (1 if "--settle" in mode else 0)
    assert run["violations"] == []
