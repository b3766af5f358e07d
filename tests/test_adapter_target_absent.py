"""An adapter says its table is missing with ``TargetAbsent`` (the adapter how-to): the run
stops before any record is marked in flight, with the adapter's message as one line —
exit 74 while nothing is pinned, 78 once the store is pinned to that target."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runner.errors import TargetAbsent, TargetMismatch, TargetUnavailable
from tests.helpers import CliStore

pytestmark = pytest.mark.timeout(60)

ADAPTER = ("--target-adapter", "tests.procs.absent_adapter:make")


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("runner: error:")]


def test_a_missing_table_stops_the_run_with_one_line_and_marks_nothing(
        cli_store: CliStore, workdir: Path) -> None:
    table = workdir / "rows.db"
    cli_store.target = table
    cli_store.accept(1)
    first = cli_store.once(*ADAPTER)
    assert first.returncode == TargetAbsent.exit_code == TargetUnavailable.exit_code == 74
    assert _errors(first.stderr) == [
        f"runner: error: no table at {table} (its owner creates it)"], first.stderr
    assert "Traceback" not in first.stderr
    assert cli_store.records()["lead-1"]["state"] == "prepared" and not table.exists()
    sqlite3.connect(table).close()  # its owner creates it: the next run delivers
    assert cli_store.cli("once", *ADAPTER)["confirmed"] == 1
    table.unlink()  # gone again, now that the store is pinned to it
    cli_store.accept(2)
    again = cli_store.once(*ADAPTER)
    assert again.returncode == TargetMismatch.exit_code == 78, again.stderr
    [line] = _errors(again.stderr)
    assert line.startswith("runner: error: the store is pinned to target table-"), line
    assert line.endswith(f": no table at {table} (its owner creates it); nothing was "
                         "changed"), line
    records = cli_store.records()
    assert (records["lead-1"]["state"], records["lead-2"]["state"]) == ("confirmed",
                                                                       "prepared")
