"""The store-memory campaigns of issue 30 (``bench/forget.py``) at their smallest sizes,
as the bench runs them: real ``runner`` processes, a real primary/standby pair
(``harness.pgpair``) with a real ``kill -9`` and promotion, SQLite store files emptied,
deleted or restored.  Each asserts what the mode promises: no lead with two rows at the
target, every record confirmed or visibly uncertain, no acknowledged event lost where
replication is synchronous (or intake ended before the cut), and that runner said what it
found (its ``store.rewind`` / ``store.rewound`` lines, the refusal naming
``runner target adopt``, the loser's one line).

Slow campaigns (``CAMPAIGNS`` in tests/conftest.py); the full counts are the bench's:
``python -m bench forget`` (bench/results/forget-<UTC>.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.pgcluster import require

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def forget(tmp_path: Path, mode: str, *extra: str) -> dict[str, Any]:
    """``python -m bench forget --mode MODE --quick …`` as a subprocess; its document for
    the mode, which must pass."""
    report = tmp_path / "forget.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "forget", "--mode", mode, "--quick", "--json",
         str(report), *extra], cwd=ROOT, capture_output=True, text=True, timeout=220,
        check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(report.read_text())["modes"][mode]
    assert doc["ok"] and doc["violations"] == []
    for r in doc["rounds"]:
        assert (r["duplicated"], r["unsettled"]) == (0, 0), r
        assert r["rows_at_target"] == r["confirmed"] + r["rows_for_leads_not_in_store"], r
        assert r["uncertain_with_a_row"] == r["confirmed_without_a_row"] == 0, r
    return doc


def actions(r: dict[str, Any]) -> list[str]:
    return [x["action"] for x in r["runner_said"]]


def test_a_promoted_lagging_standby_sends_nothing_twice_and_counts_what_it_lost(
        tmp_path: Path) -> None:
    """The headline reproduction, with accepts going on through the cut: the store on
    the promoted standby forgot the batches of the lag; it reads back before sending.
    The acknowledged events it lost all lie in the window runner's asynchronous warning
    named (acknowledged after the standby last had everything)."""
    require()
    doc = forget(tmp_path, "async-lag", "--variants", "during-lag", "--leads", "150")
    (r,) = doc["rounds"]
    assert r["replication_before_cut"]["mode"] == "asynchronous"
    assert "can be missing on the standby promoted" in r["replication_before_cut"]["detail"]
    assert r["delivered_before_failover"] > 0
    assert actions(r)[:2] == ["store.rewind", "store.rewound"]
    assert "the store forgot what it sent" in r["runner_said"][0]["message"]
    assert r["lost_acknowledged"] <= r["acknowledged_after_last_replay"]
    assert r["lost_outside_the_warned_window"] == 0


def test_an_emptied_or_restored_sqlite_store_sends_nothing_twice_and_says_so(
        tmp_path: Path) -> None:
    doc = forget(tmp_path, "sqlite", "--variants", "emptied,restored", "--leads", "30")
    emptied, restored = doc["rounds"]
    assert emptied["once_exit"] == 78 and emptied["adopt_exit"] == 0
    assert "runner target adopt" in emptied["refused"]
    assert emptied["rows_after_refusal"] == emptied["rows_before_reaccept"]
    assert "store.rewind" in actions(emptied) and "store.rewound" in actions(emptied)
    for r in (emptied, restored):
        assert r["lost_acknowledged"] == 0 and r["confirmed"] == r["leads"] == 30


def test_two_workers_racing_for_the_new_primary_one_delivers(tmp_path: Path) -> None:
    require()
    doc = forget(tmp_path, "race", "--leads", "40")
    (r,) = doc["rounds"]
    # the loser steps aside: another worker holds the lock (75); or, on a loaded machine,
    # the second was still starting when the kill ended its session or before the standby
    # took writes (74, said: start-up does not wait for a store)
    assert (r["loser_exit"] == 75 and "holds the lock" in r["loser_said"]) or (
        r["loser"] == "second" and r["loser_exit"] == 74
        and "PostgreSQL at" in r["loser_said"])
    assert r["loser_confirmed_after_the_failover"] == 0 and r["winner_exit"] == 0
    assert r["lost_acknowledged"] == 0 and r["confirmed"] == 40


def test_a_synchronous_pair_fails_over_during_delivery_and_loses_nothing(
        tmp_path: Path) -> None:
    require()
    doc = forget(tmp_path, "sync", "--failovers", "1", "--variants", "delivery",
                 "--leads", "300", "--batch-size", "100")
    (r,) = doc["rounds"]
    assert r["lost_acknowledged"] == 0 and r["confirmed"] + r["uncertain"] == 300
    assert r["start_exit"] == 0 and r["start_errors"] == []
    assert "store.reconnected" in actions(r)
    assert doc["failover_seconds"]["n"] == 1 and doc["promotion_seconds"]["n"] == 1
