"""Files and privacy (K7, issue 2 point 9, issue 8.7): the store's files are 0600 whatever
the umask, symlinked paths are refused by every command, and a canary contact alias never
reaches stdout, stderr, logs, exception text or ``status`` (which only says whether an
alias is present)."""

from __future__ import annotations

import os
import stat
import traceback
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.errors import BadInputError, RunnerError
from runner.leads.intake import prepare
from runner.leads.models import Scope
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import (
    CANARY,
    SCOPE,
    Child,
    dump_db,
    event,
    ndjson,
    run_command,
    run_main,
    write_json,
)


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
        proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", rec,
                       "--log-format", fmt)
        outputs += [proc.stdout, proc.stderr]
    status = run_main("status", "--db", db, "--log-format", fmt)
    outputs += [status.stdout, status.stderr]
    assert status.returncode == 0
    assert all(CANARY not in text for text in outputs)
    assert any("lead-1" in text for text in outputs)  # records are named by key


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_canary_never_leaves_through_a_whole_delivery_lifecycle(
    workdir: Path, scope_file: Path, fmt: str
) -> None:
    db, target = workdir / "queue.db", workdir / "target.db"
    base = ["--db", db, "--scope", scope_file]
    worker = [*base, "--target", target, "--log-format", fmt]
    outputs: list[str] = []

    def run(*args: str | Path, code: int = 0) -> None:
        proc = run_command(*args)  # the crashes in a real process, the rest in process
        assert proc.returncode == code, proc.stderr
        outputs.extend([proc.stdout, proc.stderr])

    for i in range(4):
        rec = write_json(workdir / f"e{i}.json", event(i, contact_alias=CANARY))
        run("accept", *base, "--record", rec, "--log-format", fmt)
    run("once", *worker, "--fault", "timeout", "--dispatch-limit", "1")   # uncertain
    # failed_safe, due again at once (--retry-base 0) so that ``start`` below resends it
    run("once", *worker, "--fault", "outage", "--dispatch-limit", "1", "--retry-base", "0")
    run("once", *worker, "--fault", "crash-after-write", code=73)         # crashed
    run("once", *worker, "--fault", "crash-at:reconcile.before-commit", code=73)
    run("start", *worker, "--cycles", "2", "--interval", "0")             # recovers all
    snap = write_json(workdir / "won.json", {"status": "won"})
    run("observe", *base, "--record", workdir / "e0.json", "--snapshot", snap,
        "--log-format", fmt)
    run("poll-status", *worker, "--fault", "read-error", code=74)  # every read failed
    run("status", *base, "--records", "--log-format", fmt)
    records = ndjson(outputs[-2])
    assert {r["state"] for r in records} == {"confirmed"}
    assert all(r["contact_alias_present"] is True for r in records)
    assert all(CANARY not in text for text in outputs)
    assert {row[6] for row in sheet_rows(target)} == {CANARY}  # it did reach the target


def test_status_says_whether_an_alias_is_present_never_its_value(
    workdir: Path, scope_file: Path
) -> None:
    db = workdir / "queue.db"
    docs = [event(1, contact_alias=CANARY), event(2, contact_alias=""), event(3)]
    del docs[2]["contact_alias"]
    for i, doc in enumerate(docs):
        rec = write_json(workdir / f"e{i}.json", doc)
        assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                       ).returncode == 0
    proc = run_main("status", "--db", db, "--records")
    assert proc.returncode == 0, proc.stderr
    present = {r["source_lead_id"]: r["contact_alias_present"] for r in ndjson(proc.stdout)}
    assert present == {"lead-1": True, "lead-2": True, "lead-3": False}
    assert CANARY not in proc.stdout


async def test_exception_text_never_carries_the_canary(workdir: Path) -> None:
    scope = Scope.model_validate(SCOPE)
    bad_inputs = [
        event(1, contact_alias=CANARY, synthetic="true"),
        event(1, contact_alias=CANARY, tenant_id=CANARY),
        event(1, contact_alias=[CANARY]),
        {**event(1), "extra": CANARY},  # an unexpected field is named, its value never
        event(1, source_lead_id="", contact_alias=CANARY * 100),
    ]
    errors: list[RunnerError] = []
    for doc in bad_inputs:
        with pytest.raises(BadInputError) as info:
            prepare(doc, scope)
        errors.append(info.value)
    adapter = ScriptedAdapter(workdir / "t.db")
    async with DurableWorker(str(workdir / "q.db"), SCOPE, adapter) as worker:
        await worker.accept(event(1, contact_alias=CANARY))
        conflict = await worker.accept(event(1, contact_alias=CANARY + "!"))
        assert conflict.message is not None and CANARY not in conflict.message
        with pytest.raises(RunnerError) as info:
            await worker.observe(event(1, contact_alias=CANARY), {"status": "won"})
        errors.append(info.value)
    for exc in errors:
        text = "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)
        assert CANARY not in text, text


def _modes(paths: list[Path]) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in paths}


def test_store_files_and_lock_are_0600_under_umask_022(workdir: Path, scope_file: Path) -> None:
    db, target = workdir / "queue.db", workdir / "target.db"
    old = os.umask(0o022)
    try:
        rec = write_json(workdir / "e.json", event(1))
        assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                       ).returncode == 0
        child = Child("start", "--db", db, "--scope", scope_file, "--target", target,
                      "--interval", "3600")
    finally:
        os.umask(old)
    try:
        child.wait_out_lines(1)  # a live worker: its connection keeps -wal and -shm
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.lock")]
        modes = _modes(files)
    finally:
        child.kill()
    assert modes == dict.fromkeys(modes, 0o600) and len(modes) == 4, modes
    assert _modes([target])[target.name] == 0o600


COMMANDS = ["accept", "once", "start", "status", "observe", "poll-status"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_symlinked_database(
    workdir: Path, scope_file: Path, command: str
) -> None:
    real, link, target = workdir / "real.db", workdir / "link.db", workdir / "target.db"
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", real, "--scope", scope_file, "--record", rec
                   ).returncode == 0
    before = dump_db(real)
    link.symlink_to(real)
    extra: dict[str, list[str | Path]] = {
        "accept": ["--record", rec], "start": ["--target", target, "--cycles", "1"],
        "once": ["--target", target], "poll-status": ["--target", target],
        "observe": ["--record", rec, "--snapshot", write_json(workdir / "s.json", {})],
        "status": []}
    proc = run_command(command, "--db", link, "--scope", scope_file, *extra[command])
    assert proc.returncode == 77 and "symlink" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert dump_db(real) == before and not target.exists()


def test_a_symlinked_lock_file_is_refused_and_never_followed(
    workdir: Path, scope_file: Path
) -> None:
    db, target = workdir / "queue.db", workdir / "target.db"
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                   ).returncode == 0
    Path(f"{db}.lock").symlink_to(workdir / "elsewhere")
    proc = run_main("once", "--db", db, "--scope", scope_file, "--target", target)
    assert proc.returncode == 77 and "symlink" in proc.stderr
    assert not (workdir / "elsewhere").exists()
