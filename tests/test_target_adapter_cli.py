"""``--target-adapter module:factory`` (issue 17): a user's adapter loaded by the CLI
delivers as a built-in one, passes the conformance kit, and a bad spec is one clear
error; the docs show the example adapter exactly as the file the tests run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.testing import Condition, Harness, check_adapter
from tests.helpers import ROOT, CliStore, last_json, run_main
from tests.procs.example_adapter import JsonRowsTarget

pytestmark = pytest.mark.timeout(60)

SPEC = "tests.procs.example_adapter:make"


def test_a_loaded_adapter_delivers_reconciles_and_polls(cli_store: CliStore,
                                                        workdir: Path) -> None:
    rows = workdir / "rows.db"
    cli_store.target = rows
    cli_store.accept(1, 2, 3)
    summary = cli_store.cli("once", "--target-adapter", SPEC, "--batch-size", "2")
    assert (summary["dispatched"], summary["confirmed"]) == (3, 3)
    # under runner's own timeout fault: written, then uncertain, then reconciled
    cli_store.accept(4)
    assert cli_store.cli("once", "--target-adapter", SPEC, "--fault", "timeout")[
        "uncertain"] == 1
    again = cli_store.cli("once", "--target-adapter", SPEC)
    assert (again["reconciled"], again["polled"], again["poll_failed"]) == (1, 4, 0)
    assert {r["state"] for r in cli_store.records().values()} == {"confirmed"}
    assert len(JsonRowsTarget(str(rows)).read_back_many(
        [r["write_id"] for r in cli_store.records().values()])) == 4


@pytest.mark.parametrize(("spec", "says"), [
    ("nocolon", "MODULE:FACTORY"),
    ("tests.procs.no_such_module:make", "cannot import"),
    ("tests.procs.example_adapter:nothing", "has no"),
    ("tests.procs.example_adapter:TABLE", "not callable"),
    ("tests.procs.example_adapter:JsonRowsTarget.write", "failed"),
])
def test_a_bad_adapter_spec_is_one_clear_error_and_changes_nothing(
        cli_store: CliStore, spec: str, says: str) -> None:
    cli_store.accept(1)
    proc = run_main("once", "--db", cli_store.db, "--scope", cli_store.scope,
                    "--target", "x", "--target-adapter", spec)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert cli_store.records()["lead-1"]["state"] == "prepared"


def test_an_adapter_max_batch_caps_each_request_whatever_the_batch_size(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.target = workdir / "rows.db"
    cli_store.accept(1, 2, 3, 4, 5)
    proc = cli_store.once("--target-adapter", "tests.procs.capped_adapter:make",
                          "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    summary = last_json(proc.stdout)
    assert (summary["dispatched"], summary["confirmed"]) == (5, 5)
    sent = [json.loads(line) for line in proc.stderr.splitlines()
            if '"batch.in_flight"' in line or '"lead.in_flight"' in line]
    assert [e.get("count", 1) for e in sent] == [2, 2, 1]  # the default batch is 1,000


@pytest.mark.parametrize("factory", ["zero", "text"])
def test_a_bad_max_batch_is_one_clear_error_and_changes_nothing(
        cli_store: CliStore, workdir: Path, factory: str) -> None:
    cli_store.accept(1)
    proc = run_main("once", "--db", cli_store.db, "--scope", cli_store.scope,
                    "--target", str(workdir / "rows.db"), "--target-adapter",
                    f"tests.procs.capped_adapter:{factory}")
    assert proc.returncode == 2 and "max_batch must be a positive whole number" in (
        proc.stderr), proc.stderr
    assert cli_store.records()["lead-1"]["state"] == "prepared"
    assert not (workdir / "rows.db").exists()


def test_the_example_adapter_conforms(workdir: Path) -> None:
    path = str(workdir / "rows.db")
    harness = Harness(healthy=lambda: JsonRowsTarget(path), conditions={
        Condition.UNREACHABLE: lambda: JsonRowsTarget(str(workdir / "no" / "rows.db"))})
    check_adapter(harness).assert_passed(require=[Condition.UNREACHABLE])


def test_the_how_to_shows_the_example_adapter_as_it_is() -> None:
    page = (ROOT / "docs" / "how-to" / "target-adapter.md").read_text(encoding="utf-8")
    source = (ROOT / "tests" / "procs" / "example_adapter.py").read_text(encoding="utf-8")
    assert f"```python\n{source}```" in page


def test_a_capped_adapter_conforms_and_a_bad_cap_fails_the_kit(workdir: Path) -> None:
    from tests.procs import capped_adapter

    path = str(workdir / "rows.db")
    check_adapter(Harness(healthy=lambda: capped_adapter.make(path))).assert_passed()
    report = check_adapter(Harness(healthy=lambda: capped_adapter.zero(path)))
    assert [c.name for c in report.failures] == ["healthy: batch"], report.text()
