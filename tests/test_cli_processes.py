"""Every command once as a real process (``python run.py COMMAND``), the way a user runs it.

The rest of the CLI suite checks exit codes and output shapes through ``main(argv)`` in
process; this file proves that the process around it gives the same: the exit code, one
line of compact JSON per result on stdout, nothing but logs on stderr.  The store is
arranged in process; only the act is a process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli import COMMANDS
from tests.helpers import event, run_cli, run_main, write_json

NOW = "2026-08-11T12:00:00Z"

#: command -> (its command line after ``run.py``, the keys of its stdout line)
SUMMARY = {"recovered", "reconciled", "dispatched", "confirmed", "failed_safe", "uncertain",
           "polled"}
ACTS: dict[str, tuple[str, set[str]]] = {
    "accept": ("accept --db {db} --scope {scope} --record {new_record}",
               {"result", "source_lead_id", "write_id"}),
    "once": ("once --db {db} --scope {scope} --target {target}", SUMMARY),
    "start": ("start --db {db} --scope {scope} --target {target} --cycles 1 --interval 0",
              SUMMARY),
    "status": ("status --db {db}", {"scope", "schema_version", "counts", "uncertain", "outbox",
                                   "poll_health", "lifecycle", "pipeline", "funnel"}),
    "observe": ("observe --db {db} --scope {scope} --record {record} --snapshot {snapshot}",
                {"result", "source_lead_id"}),
    "poll-status": ("poll-status --db {db} --scope {scope} --target {target}",
                    {"polled", "changed", "unchanged", "missing", "failed"}),
    "candidate": (f"candidate add --db {{db}} --id c2 --now {NOW}",
                  {"id", "status", "expires_at"}),
    "sweep": (f"sweep --db {{db}} --now {NOW}", {"expired", "reconciled"}),
    "worker": ("worker raw-retriever --db {db} --cycles 1", {"worker", "cycle", "claimed"}),
    "job": ("job backfill --db {db}", {"job", "from_seq", "to_seq", "read"}),
    "backlog": ("backlog --db {db}", {"pending_total", "stages"}),
    "outbox": ("outbox watermark --db {db}", {"floor", "export_watermark", "pruned"}),
    "uncertain": ("uncertain --db {db}", {"records", "count"}),
    # the arranged record is confirmed: resolve refuses it (65) and says so on stdout
    "resolve": ("resolve --db {db} --write-id w-none --as confirmed --reason smoke --dry-run",
                {"result", "reason", "write_id"}),
    # the arranged target keeps this store's own marks: nothing to adopt, said on stdout
    "target": ("target adopt --db {db} --scope {scope} --target {target} --reason smoke",
               {"adopted", "store_id"}),
    "config": ("config show -- status --db {db}", {"command", "config", "values"}),
    "pipeline": ("pipeline prune --db {db} --before 1h --dry-run",
                 {"before", "dry_run", "rounds", "outbox_floor", "removed"}),
}
#: the exit code a smoke line ends with, where it is not 0
EXIT = {"resolve": 65}
#: commands that serve until signalled, each run as a real process where it is tested
SERVERS = {"serve": "tests/test_http_processes.py",
           "target-serve": "tests/test_http_target.py"}


def test_the_table_covers_every_command() -> None:
    assert set(ACTS) | set(SERVERS) == set(COMMANDS)
    assert not set(ACTS) & set(SERVERS)


@pytest.mark.parametrize("command", sorted(ACTS))
def test_each_command_as_a_real_process(workdir: Path, scope_file: Path, command: str) -> None:
    db, target = workdir / "queue.db", workdir / "target.db"
    values = {
        "scope": str(scope_file), "target": str(target),
        "record": str(write_json(workdir / "e1.json", event(1))),
        "new_record": str(write_json(workdir / "e2.json", event(2))),
        "snapshot": str(write_json(workdir / "won.json", {"status": "won"})),
    }
    # arranged in process: one confirmed record and one candidate
    for argv in (["accept", "--db", db, "--scope", scope_file, "--record", values["record"]],
                 ["once", "--db", db, "--scope", scope_file, "--target", target],
                 ["candidate", "add", "--db", db, "--id", "c1", f"--now={NOW}"]):
        arranged = run_main(*argv)
        assert arranged.returncode == 0, arranged.stderr
    line, keys = ACTS[command]
    proc = run_cli(*[arg.format(db=db, **values) for arg in line.split()])
    assert proc.returncode == EXIT.get(command, 0), proc.stderr
    assert proc.stdout.endswith("\n") and ": " not in proc.stdout  # compact JSON lines
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    doc = json.loads(lines[0])
    assert keys <= set(doc), doc
    assert "Traceback" not in proc.stderr
