"""Logs and output never carry contact fields (K7, issue 2 point 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import CANARY, event, run_cli, write_json


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_contact_alias_never_reaches_output(
    workdir: Path, scope_file: Path, db_location: str, fmt: str
) -> None:
    db = db_location
    cases = [
        event(1, contact_alias=CANARY),                       # accepted
        event(1, contact_alias=CANARY),                       # duplicate
        event(1, contact_alias=CANARY + "-changed"),          # conflict
        event(2, contact_alias=CANARY, synthetic="true"),     # invalid
        event(3, contact_alias=CANARY, tenant_id="other"),    # out of scope
        event(4, contact_alias=[CANARY]),                     # wrong type
    ]
    outputs = []
    for i, doc in enumerate(cases):
        rec = write_json(workdir / f"e{i}.json", doc)
        proc = run_cli("accept", "--db", db, "--scope", scope_file, "--record", rec,
                       "--log-format", fmt)
        outputs += [proc.stdout, proc.stderr]
    status = run_cli("status", "--db", db, "--log-format", fmt)
    outputs += [status.stdout, status.stderr]
    assert status.returncode == 0
    assert all(CANARY not in text for text in outputs)
    assert any("lead-1" in text for text in outputs)  # records are named by key
