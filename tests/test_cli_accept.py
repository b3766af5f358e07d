"""``accept`` as a user runs it: one JSON line, exit codes, and a store left untouched by
every bad input (L3, K8)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import (
    SCOPE,
    dump_store,
    event,
    last_json,
    run_main,
    store_exists,
    write_json,
)


@pytest.fixture
def db(db_location: str) -> str:
    return db_location


def accept(db: str, scope: Path, record: Path | str, **kw):
    return run_main("accept", "--db", db, "--scope", scope, "--record", record, **kw)


def test_accept_duplicate_conflict_round_trip(workdir: Path, db: str, scope_file: Path) -> None:
    rec = write_json(workdir / "e.json", event(1))
    first = accept(db, scope_file, rec)
    assert first.returncode == 0, first.stderr
    out = last_json(first.stdout)
    assert out["result"] == "accepted" and out["source_lead_id"] == "lead-1" and out["write_id"]
    assert first.stdout.count("\n") == 1  # one line of compact JSON
    assert ": " not in first.stdout

    again = accept(db, scope_file, rec)
    assert again.returncode == 0
    assert last_json(again.stdout) == {**out, "result": "duplicate"}

    before = dump_store(db)
    conflict = accept(db, scope_file, write_json(workdir / "c.json", event(1, contact_alias="x")))
    assert conflict.returncode == 65
    assert last_json(conflict.stdout) == {
        "result": "rejected", "source_lead_id": "lead-1", "write_id": None, "reason": "conflict"
    }
    assert len(conflict.stderr.strip().splitlines()) == 1
    assert dump_store(db) == before


BAD_RECORDS = {
    "not_json": (b"{not json", "invalid_json"),
    "not_object": (b"[1,2,3]", "not_an_object"),
    "invalid_utf8": (b'{"source_lead_id": "\xff"}', "invalid_json"),
    "missing_field": (json.dumps({k: v for k, v in event(1).items() if k != "source"}).encode(),
                      "invalid_record"),
    "extra_field": (json.dumps(event(1, extra=1)).encode(), "invalid_record"),
    "synthetic_string": (json.dumps(event(1, synthetic="true")).encode(), "invalid_record"),
    "synthetic_one": (json.dumps(event(1, synthetic=1)).encode(), "invalid_record"),
    "synthetic_false": (json.dumps(event(1, synthetic=False)).encode(), "invalid_record"),
    "source_not_meta": (json.dumps(event(1, source="web")).encode(), "invalid_record"),
    "empty_lead_id": (json.dumps(event(1, source_lead_id="")).encode(), "invalid_record"),
    "wrong_tenant": (json.dumps(event(1, tenant_id="tenant-other")).encode(), "scope_mismatch"),
    "wrong_account": (json.dumps(event(1, account_id="acc-other")).encode(), "scope_mismatch"),
    "wrong_page": (json.dumps(event(1, page_id="page-other")).encode(), "scope_mismatch"),
    "wrong_form": (json.dumps(event(1, form_id="form-other")).encode(), "scope_mismatch"),
    "duplicate_key": (b'{"source":"meta","source":"meta"}', "invalid_json"),
}


@pytest.mark.parametrize("existing", [False, True], ids=["no-store", "existing-store"])
@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_every_bad_input_is_rejected_and_changes_nothing(
    workdir: Path, db: str, scope_file: Path, case: str, existing: bool
) -> None:
    if existing:
        assert accept(db, scope_file, write_json(workdir / "ok.json", event(0))).returncode == 0
    before = dump_store(db)
    data, reason = BAD_RECORDS[case]
    rec = workdir / "bad.json"
    rec.write_bytes(data)
    proc = accept(db, scope_file, rec)
    assert proc.returncode == 65, proc.stderr
    out = last_json(proc.stdout)
    assert out["result"] == "rejected" and out["reason"] == reason
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert dump_store(db) == before


def test_unreadable_record_file(workdir: Path, missing_location: str, scope_file: Path) -> None:
    missing = accept(missing_location, scope_file, workdir / "missing.json")
    assert missing.returncode == 65 and last_json(missing.stdout)["reason"] == "unreadable"
    if os.geteuid() != 0:  # root reads anything
        locked = write_json(workdir / "locked.json", event(1))
        locked.chmod(0)
        assert accept(missing_location, scope_file, locked).returncode == 65
    directory = accept(missing_location, scope_file, workdir)
    assert directory.returncode == 65
    assert not store_exists(missing_location)


def test_record_from_stdin(db: str, scope_file: Path) -> None:
    proc = accept(db, scope_file, "-", input=json.dumps(event(5)))
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["source_lead_id"] == "lead-5"


def test_bad_scope_file_is_bad_input(workdir: Path, missing_location: str) -> None:
    rec = write_json(workdir / "e.json", event(1))
    bad = write_json(workdir / "scope.json", {**SCOPE, "form_id": ""})
    proc = accept(missing_location, bad, rec)
    assert proc.returncode == 65 and last_json(proc.stdout)["reason"] == "invalid_scope"
    assert not store_exists(missing_location)


def test_changed_database_scope_exits_78_and_changes_nothing(
    workdir: Path, db: str, scope_file: Path
) -> None:
    assert accept(db, scope_file, write_json(workdir / "a.json", event(1))).returncode == 0
    before = dump_store(db)
    other_scope = write_json(workdir / "other.json", {**SCOPE, "page_id": "page-2"})
    rec = write_json(workdir / "b.json", event(2, page_id="page-2"))
    proc = accept(db, other_scope, rec)
    assert proc.returncode == 78, proc.stderr
    assert "pinned to another scope" in proc.stderr and "page_id" in proc.stderr
    assert dump_store(db) == before


@pytest.mark.usefixtures("sqlite_only")
def test_db_and_target_the_same_file_is_a_usage_error(
    workdir: Path, db: str, scope_file: Path
) -> None:
    rec = write_json(workdir / "e.json", event(1))
    same = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec, "--target", db)
    assert same.returncode == 2 and "same file" in same.stderr
    os.link(scope_file, workdir / "hardlink.json")  # any two names of one file
    assert run_main("status", "--db", scope_file, "--target", f"sqlite:{workdir / 'hardlink.json'}"
                   ).returncode == 2
    assert not store_exists(db)


def test_usage_errors_exit_2_with_one_line(db: str) -> None:
    for argv in (["accept", "--db", str(db)], ["bogus"], [], ["status"]):
        proc = run_main(*argv)
        assert proc.returncode == 2, argv
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_console_script_is_the_same_as_run_py(workdir: Path, db: str, scope_file: Path) -> None:
    import subprocess
    import sys

    script = shutil.which("runner", path=str(Path(sys.executable).parent))
    assert script, "the runner console script is installed with the package"
    rec = write_json(workdir / "e.json", event(1))
    via_script = subprocess.run(
        [script, "accept", "--db", str(db), "--scope", str(scope_file), "--record", str(rec)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert via_script.returncode == 0, via_script.stderr
    via_run = accept(db, scope_file, rec)
    assert last_json(via_run.stdout) == {**last_json(via_script.stdout), "result": "duplicate"}
