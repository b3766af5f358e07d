"""The sweep benchmark keeps working (``bench/sweep.py --quick``, as CI runs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


def test_the_quick_sweep_benchmark_runs_and_both_sides_change_the_same_rows() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep.py"), "--quick"],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    # 5,000 candidates: 40 % expire (T3, T4), 10 % stuck promotions are reconciled;
    # the script exits 1 if the plain UPDATEs (on a copy of the same store, and on a bare
    # table) changed other rows than the runner's sweep
    assert doc["n"] == 5000 and doc["result"] == {"expired": 2000, "reconciled": 500}
    assert doc["runner_seconds"] > 0 and doc["plain_seconds"] > 0 and doc["ratio"] > 0
    assert doc["bare_seconds"] > 0 and doc["bare_ratio"] > 0
    assert "the same store" in proc.stdout and "a bare table" in proc.stdout


def test_the_pipeline_benchmark_drains_every_input_with_one_and_four_workers() -> None:
    """``bench/pipeline.py`` keeps working (runner's side; the comparison queues live in
    the benchmark's own environment, which the suite does not build)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pipeline.py"), "--quick",
                           "--runner-only"], capture_output=True, text=True, timeout=100,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["n"] == 2000
    assert [(r["backend"], r["workers"]) for r in doc["rows"]] == [("sqlite", 1),
                                                                  ("sqlite", 4)]
    assert all(r["runner"]["per_s"] > 0 for r in doc["rows"])


def test_the_sweep_explanation_times_every_step_over_the_same_rows() -> None:
    """``bench/sweep.py --explain`` removes the sweep's guarantees one part at a time; it
    exits 1 unless every step changed the same rows, so each line is a fair comparison."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep.py"), "--quick",
                           "--explain"], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("5,000 candidates") and len(lines) == 6
    assert lines[1].startswith("plain UPDATEs") and lines[1].endswith("1.0 x")
    assert lines[-1].startswith("runner's schema") and all(" ms " in line for line in lines[1:])


def test_the_http_target_benchmark_runs_both_senders_against_one_server() -> None:
    """``python -m bench http-target --quick`` keeps working: runner's once and the bare
    httpx client post to the same reference server, and runner's once to a ``--dedupe``
    server (figures are printed, not judged)."""
    proc = subprocess.run([sys.executable, "-m", "bench", "http-target", "--quick"],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "runner once --target http://" in proc.stdout
    assert "bare httpx, append only" in proc.stdout and "ratio" in proc.stdout
    # protocol v2 (issue 29): runner against target-serve --dedupe reads nothing back
    assert "runner, target-serve --dedupe" in proc.stdout
    assert "0 read requests" in proc.stdout


def test_the_postgresql_table_target_benchmark_runs_runner_and_the_floor() -> None:
    """``python -m bench pg-target --quick`` keeps working: runner (in process, and as a
    ``once`` process) and the bare asyncpg loop deliver into tables on the test server
    (figures are printed, not judged)."""
    from tests import pg

    pg.require()
    proc = subprocess.run([sys.executable, "-m", "bench", "pg-target", "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "RUNNER_BENCH_PG_DSN": pg.dsn()})
    assert proc.returncode == 0, proc.stderr
    assert "runner, in process (run_cycle)" in proc.stdout
    assert "bare asyncpg, the same INSERTs" in proc.stdout and "ratio" in proc.stdout
    where = next(line for line in proc.stdout.splitlines()
                 if line.startswith("where runner's cycle goes"))
    # the store's step is timed on the marked path the table target takes (mark_batch)
    assert "store step " in where and "store step and send at once" in where
    assert "a batch mark adds" in proc.stdout and "in pairs" in proc.stdout


def test_the_statement_without_its_triggers_names_every_trigger_it_fires(
        tmp_path: Path) -> None:
    """``bench.pipeline_spans`` times the batch statement without groups of its row
    triggers; its list of them is checked against the store's schema, so a trigger the
    list leaves out (renamed, or added by a migration) stops the benchmark instead of
    being counted as the statement's own work."""
    import anyio

    from bench.leads import _prepare
    from bench.pipeline_spans import _ALONE, TRIGGER_GROUPS, _child

    db = tmp_path / "q.db"
    anyio.run(_prepare, db, None, 10, False)
    partial = {**TRIGGER_GROUPS, "all": TRIGGER_GROUPS["all"][:-1]}
    with pytest.raises(RuntimeError, match=TRIGGER_GROUPS["all"][-1]):
        _child(_ALONE, str(db), json.dumps(partial))


def test_the_time_spans_cover_is_their_union() -> None:
    """``bench.pg_target.covered``: overlapping spans count once, gaps not at all, in any
    order; so "neither ran" is the cycle less it."""
    from bench.pg_target import covered

    assert covered([]) == 0
    assert covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert covered([(5.0, 6.0), (1.0, 3.0), (0.0, 2.0), (1.5, 2.5)]) == 4.0
    assert covered([(0.0, 4.0), (1.0, 2.0)]) == 4.0


def test_the_resolve_benchmark_settles_every_record_both_ways() -> None:
    """``python -m bench resolve --quick`` keeps working: a crashed batch arranged through
    the CLI, a sample resolved one process per record, the rest by one ``resolve --all``
    (the script exits non-zero unless every record was decided)."""
    proc = subprocess.run([sys.executable, "-m", "bench", "resolve", "--quick", "--backend",
                           "sqlite"], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    (row,) = doc["rows"]
    assert row["backend"] == "sqlite" and row["records"] == 200 and row["chunks"] == 1
    assert row["resolve_all_s"] > 0 and row["single_mean_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_failover_benchmark_times_a_kill9_and_finds_no_row_twice() -> None:
    """``python -m bench failover --quick`` keeps working (issue 30): two kill -9 and
    restarts of a private cluster during delivery, timed from runner's own log; the
    script exits non-zero if a row was written twice (figures are printed, not judged)."""
    from tests import pgcluster

    pgcluster.require()
    proc = subprocess.run([sys.executable, "-m", "bench", "failover", "--quick"],
                          capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "death -> first confirmed delivery" in proc.stdout
    assert "the server's own restart" in proc.stdout
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["duplicated_rows"] == 0 and doc["summary"]["lag"]["min"] > 0


@pytest.mark.slow
def test_the_delivery_floor_benchmark_prints_both_ratios(tmp_path: Path) -> None:
    """``python -m bench delivery-floor --quick --backend sqlite`` keeps working (issue 32):
    the batched stdlib floor and runner's ``once`` deliver the same leads, and the table
    gives runner's in-process and whole-process ratios to the floor, serial and with
    ``--dispatch-pipeline on``, then the profile."""
    profile = tmp_path / "once.prof"
    proc = subprocess.run([sys.executable, "-m", "bench", "delivery-floor", "--quick",
                           "--backend", "sqlite", "--profile", str(profile)],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    ratios = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^SQLite\s+2,000 ((?:pipel\. )?(?:in process|whole process))\s+[\d,]+/s\s+"
        r"[\d,]+/s\s+(\d+\.\d\d)", proc.stdout, re.MULTILINE)}
    assert set(ratios) == {"in process", "whole process", "pipel. in process",
                           "pipel. whole process"}, proc.stdout
    assert all(r > 0 for r in ratios.values())
    assert "dispatch (worker thread), by cumulative time:" in proc.stdout
    assert profile.stat().st_size > 0
    spans = re.search(r"where a pipelined batch's time goes .*?(\d+) batches.*?pace "
                      r"([\d.]+); request ([\d.]+) beside commit ([\d.]+)", proc.stdout)
    assert spans, proc.stdout
    assert int(spans.group(1)) == 2 and all(float(x) > 0 for x in spans.groups()[1:])
    # the statement alone, then without each group of its row triggers (dropped on a copy)
    without = dict(re.findall(r"; without (the kept counts' triggers|the outbox event's "
                              r"trigger|the guards' triggers|every trigger it fires) "
                              r"([\d.]+)", proc.stdout))
    assert len(without) == 4 and all(float(x) > 0 for x in without.values()), proc.stdout
    # and the whole pipelined run, as made beside a copy without those triggers
    paired = re.search(r"without every trigger the statement fires \(a copy of the store, "
                       r"1 pairs, dispatch spans\): ([\d,]+)/s against ([\d,]+)/s as made, "
                       r"(\d+\.\d\d)x", proc.stdout)
    assert paired, proc.stdout
    assert all(float(x.replace(",", "")) > 0 for x in paired.groups())


def test_a_full_comparison_that_skipped_a_contender_records_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A full ``ingest`` or ``peers`` run without a contender (PgQueuer without the
    ``.[bench]`` extra) writes no results file, which the docs would render with "n/a"
    where the last complete run's figures were: it says why and exits 1."""
    import bench.results
    from bench.common import comparison_main

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a results file was written")

    monkeypatch.setattr(bench.results, "record", refuse)

    def measure(n: int, rounds: int) -> dict[str, object]:
        return {"rates": {"runner": 1.0}, "ratios": {"runner / PgQueuer": None},
                "goals": {"runner / PgQueuer": 1.1},
                "skipped": ["PgQueuer: not installed (pip install -e '.[bench]')"]}

    assert comparison_main([], "ingest", "bulk accept", "doc", ((1, 1), (2, 1)), measure) == 1
    err = capsys.readouterr().err
    assert "not recorded" in err and "PgQueuer: not installed" in err
    assert comparison_main(["--quick"], "ingest", "bulk accept", "doc", ((1, 1), (2, 1)),
                           measure) == 0


@pytest.mark.slow
def test_the_delivery_scale_benchmark_brackets_the_large_run_by_two_small_ones(
        tmp_path: Path) -> None:
    """``python -m bench delivery-scale --quick`` keeps working (issue 32 point 5): a small,
    a large and a small ``once``, each confirming every lead, and the large run's ratio to
    the small runs' mean."""
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "delivery-scale", "--quick",
                           "--backend", "sqlite", "--dispatch-pipeline", "on", "--json",
                           str(out)], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert [r["n"] for r in row["runs"]] == [2_000, 20_000, 2_000]
    assert all(r["in_process_per_s"] > 0 and r["whole_process_per_s"] > 0
               for r in row["runs"])
    big = row["runs"][1]["in_process_per_s"]
    small = (row["runs"][0]["in_process_per_s"] + row["runs"][2]["in_process_per_s"]) / 2
    assert abs(row["ratio_in_process"] - big / small) < 0.01
    assert re.search(r"^\s+20,000\s+[\d,]+/s\s+[\d,]+/s\s+\d+\.\d\d / \d+\.\d\d",
                     proc.stdout, re.MULTILINE), proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_startup_benchmark_pairs_once_with_a_bare_interpreter_and_the_disk() -> None:
    """``python -m bench startup --quick`` keeps working (issue 32 point 2): the idle
    ``once`` against ``python -c pass`` in pairs, and a whole-process dispatch against the
    disk's single-row commits, with the spans its log gives (figures printed, not judged)."""
    proc = subprocess.run([sys.executable, "-m", "bench", "startup", "--quick"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^start: once on a warm empty store minus python -c pass, 5 pairs: "
                     r"median -?\d+ ms", proc.stdout, re.MULTILINE), proc.stdout
    assert re.search(r"^dispatch of 2,000 leads, whole process: [\d,]+/s, \d+\.\d\dx the "
                     r"disk's [\d,]+ single-row commits/s", proc.stdout, re.MULTILINE)
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["start"]["pairs"] == 5 and len(doc["start"]["round_differences_s"]) == 5
    assert doc["start"]["goal_s"] == 0.15 and doc["dispatch"]["goal"] == 5.0
    dispatch = doc["dispatch"]
    assert dispatch["n"] == 2000 and dispatch["ratio"] > 0 and dispatch["commits_per_s"] > 0
    assert set(dispatch["spans_s"]) == {"start", "to_first_send", "dispatch", "to_exit"}
    assert all(s > 0 for s in dispatch["spans_s"].values())
    # the spans are parts of the whole process
    wall = dispatch["round_figures"][0]["wall_s"]
    assert sum(dispatch["round_figures"][0]["spans_s"].values()) <= wall * 1.05
    # the batched floor over as many leads in the same round, and what the goal asks of it
    first = dispatch["round_figures"][0]
    assert first["floor_per_s"] > 0
    assert first["floor_ratio"] == pytest.approx(first["floor_per_s"] / first["commits_per_s"],
                                                 rel=1e-3)
    assert 0 < first["floor_with_start_ratio"] < first["floor_ratio"]  # a start costs time
    # a process as fast as the floor falls short of the goal exactly when it needs more
    assert (first["floor_with_start_ratio"] < 5.0) == (first["needed_over_floor"] > 1.0)
    assert "the batched floor over as many leads (no process start)" in proc.stdout
    assert "figures written to" not in proc.stderr  # a quick run records nothing


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_webhook_floor_benchmark_loads_runner_serve_and_the_floor_alike() -> None:
    """``python -m bench webhook-floor --quick`` keeps working (issue 32 point 4): runner
    serve and the minimal ASGI floor take the same signed load (the bench checks that each
    stored one row and one ``accepted`` event per event), and the table and the JSON line
    give both rates, their latencies and the ratio."""
    proc = subprocess.run([sys.executable, "-m", "bench", "webhook-floor", "--quick"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^webhook vs floor, 1,000\s+[\d,.]+ req/s\s+[\d,.]+ req/s floor\s+"
                     r"\d+\.\d\d", proc.stdout, re.MULTILINE), proc.stdout
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert (doc["n"], doc["rounds"], doc["clients"], doc["goal"]) == (1000, 1, 64, 0.8)
    for side in ("runner", "floor"):
        figures = doc[side]
        assert figures["per_s"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
        assert figures["cpu_us"] > 0  # the server's CPU per request
        assert len(doc["round_figures"][side]) == 1
    assert doc["ratio"] == pytest.approx(doc["runner"]["per_s"] / doc["floor"]["per_s"])
    assert doc["met"] == (doc["ratio"] >= 0.8) and doc["accept_per_s"] > 0
    assert doc["cpu_ratio"] == pytest.approx(
        doc["floor"]["cpu_us"] / doc["runner"]["cpu_us"])
    assert "figures written to" not in proc.stderr  # a quick run records nothing
