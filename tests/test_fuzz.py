"""Bad-input fuzz (issue 8.6): 10,000 generated malformed events, scopes and snapshots are
each rejected with a typed error (exit 65; usage errors exit 2), never a traceback, never
echoing the canary contact alias, and the store never changes.

Three layers: all 10,000 through the functions the CLI calls (``runner.jsonio``,
``runner.leads.models``, ``runner.leads.intake.prepare``, ``runner.tasks.poll.snapshot_from_json``);
every tenth through the CLI's own ``main()`` in process, with stdout and stderr captured
(in four tests); and a sample through the real CLI process (10 cases in the default run,
10 others under ``pytest -m slow``).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from runner.errors import BadInputError
from runner.jsonio import parse_object
from runner.leads.intake import prepare
from runner.leads.models import Scope, validate_scope
from runner.tasks.poll import snapshot_from_json
from tests.fuzzgen import Case, cases
from tests.helpers import CANARY, SCOPE, dump_db, event, run_cli, run_main, write_json

N, SEED = 10_000, 6
#: every how many cases go through ``main()`` in process (FUZZ_MAIN_EVERY=1: all 10,000)
MAIN_EVERY = int(os.environ.get("FUZZ_MAIN_EVERY", "10"))
REASONS = {"invalid_json", "not_an_object", "too_large", "invalid_record", "scope_mismatch",
           "invalid_scope", "invalid_snapshot"}
SCOPE_MODEL = Scope.model_validate(SCOPE)


def rejection(case: Case) -> BadInputError:
    """Run a case through the validation layer; anything but BadInputError fails."""
    try:
        doc = parse_object(case.raw, what=case.kind)
        if case.kind == "event":
            prepare(doc, SCOPE_MODEL)
        elif case.kind == "scope":
            validate_scope(doc)
        else:
            snapshot_from_json(doc)
    except BadInputError as exc:
        return exc
    raise AssertionError(f"accepted a malformed {case.kind} ({case.what}): {case.raw[:200]!r}")


def test_ten_thousand_malformed_inputs_are_rejected_by_the_validation_layer() -> None:
    reasons: Counter[str] = Counter()
    for case in cases(N, SEED):
        exc = rejection(case)
        assert exc.exit_code == 65 and exc.reason in REASONS, (case, exc.reason)
        assert CANARY not in exc.message and "\n" not in exc.message, case
        assert len(exc.message) < 400, case  # never echoes the input
        reasons[f"{case.kind}:{exc.reason}"] += 1
    print(dict(sorted(reasons.items())))
    assert sum(reasons.values()) == N
    assert len(reasons) >= 12  # every kind fails in several distinct ways


class Store:
    """A store with one confirmed record, and a cheap proof that it did not change: every
    change writes an outbox event, and the outbox is append-only."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.db, self.target = workdir / "queue.db", workdir / "target.db"
        self.scope = write_json(workdir / "scope.json", SCOPE)
        self.record = write_json(workdir / "record.json", event(1, contact_alias=CANARY))
        assert cli("accept", "--db", self.db, "--scope", self.scope, "--record",
                   self.record)[0] == 0
        assert cli("once", "--db", self.db, "--scope", self.scope, "--target",
                   self.target)[0] == 0
        self.mark = self.fingerprint()

    def fingerprint(self) -> tuple[int, int]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(
                "SELECT (SELECT max(seq) FROM outbox), (SELECT count(*) FROM leads)").fetchone()

        finally:
            conn.close()

    def argv(self, case: Case, path: Path) -> list[str]:
        common = ["--db", str(self.db), "--scope", str(self.scope)]
        if case.kind == "event":
            return ["accept", *common, "--record", str(path)]
        if case.kind == "scope":
            return ["accept", "--db", str(self.db), "--scope", str(path), "--record",
                    str(self.record)]
        return ["observe", *common, "--record", str(self.record), "--snapshot", str(path)]


def cli(*argv: str | Path, guard: bool = True) -> tuple[int, str, str]:
    """The CLI's ``main()`` in process: exit code, stdout, stderr."""
    proc = run_main(*argv, guard=guard)
    return proc.returncode, proc.stdout, proc.stderr


def check_answer(case: Case, code: int, stdout: str, stderr: str) -> None:
    assert code == 65, (case, code, stderr)
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, (case, stderr)
    assert CANARY not in stdout and CANARY not in stderr, case
    if case.kind != "snapshot":  # accept answers on stdout too
        answer = json.loads(stdout)
        assert answer["result"] == "rejected" and answer["reason"] in REASONS, answer


#: the cases through ``main()`` run in this many tests (each its own store), in order
MAIN_PARTS = 4


@pytest.mark.timeout(600)
@pytest.mark.parametrize("part", range(MAIN_PARTS))
def test_through_the_cli_main_in_process(workdir: Path, part: int) -> None:
    store = Store(workdir)
    before = dump_db(store.db)
    path = workdir / "input.json"
    for i, case in enumerate(cases(N, SEED)):
        if i % MAIN_EVERY or (i // MAIN_EVERY) % MAIN_PARTS != part:
            continue
        path.write_bytes(case.raw)
        check_answer(case, *cli(*store.argv(case, path)))
        assert store.fingerprint() == store.mark, case
    assert dump_db(store.db) == before


def usage_errors(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    commands = ["accept", "once", "start", "status", "observe", "poll-status"]
    families = [
        lambda: [rng.choice(["", "accpet", "run", "--db", "sweep-all", "STATUS", "-x"])],
        lambda: [rng.choice(commands)],  # required options missing
        lambda: [rng.choice(commands), "--db", "q.db", rng.choice(["--frobnicate", "-z",
                                                                    "--db-path", "--scopes"])],
        lambda: ["start", "--db", "q.db", "--scope", "s.json", "--target", "t.db",
                 rng.choice(["--poll-limit", "--interval", "--cycles", "--grace",
                             "--dispatch-limit"]),
                 rng.choice(["-1", "x", "", "nan", "-nan", "1e999x", "0x10"])],
        lambda: ["poll-status", "--db", "q.db", "--scope", "s.json", "--target", "t.db",
                 "--poll-limit", rng.choice(["0", "1001", "100000", "-5", "1.5"])],
        lambda: ["once", "--db", "same.db", "--scope", "s.json", "--target", "same.db"],
        lambda: ["once", "--db", "q.db", "--scope", "s.json", "--target", "t.db", "--fault",
                 rng.choice(["explode", "crash-at:nowhere", "crash-at:", "hang", "Timeout"])],
        lambda: ["accept", "--db", "q.db", "--scope", "s.json", "--record", "r.json",
                 "--now", rng.choice(["yesterday", "2026-13-01", "2026-01-01T00:00:00"])],
        lambda: ["accept", "--db", "q.db", "--scope", "s.json", "--record", "r.json",
                 "--log-format", rng.choice(["xml", "JSON", ""])],
    ]
    return [rng.choice(families)() for _ in range(n)]


def test_malformed_command_lines_exit_2(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    write_json(workdir / "s.json", SCOPE)
    for argv in usage_errors(300, SEED):
        code, stdout, stderr = cli(*argv, guard=False)  # bad faults too: refused first
        assert code == 2, (argv, code, stderr)
        assert stdout == "" and len(stderr.strip().splitlines()) == 1, (argv, stderr)
        assert "Traceback" not in stderr
    assert not list(workdir.glob("*.db"))  # nothing was created


@pytest.mark.timeout(300)
@pytest.mark.parametrize("offset", [pytest.param(0, id="10-cases"),
                                    # ten other cases (the CI budget)
                                    pytest.param(30, marks=pytest.mark.slow,
                                                 id="10-more-cases")])
def test_a_sample_through_the_real_cli_process(workdir: Path, offset: int) -> None:
    store = Store(workdir)
    before = dump_db(store.db)
    sample = [c for i, c in enumerate(cases(600, SEED + 1)) if i % 60 == offset]
    for n, case in enumerate(sample):
        path = workdir / f"input-{n}.json"
        path.write_bytes(case.raw)
        proc = run_cli(*store.argv(case, path))
        check_answer(case, proc.returncode, proc.stdout, proc.stderr)
    assert store.fingerprint() == store.mark
    assert dump_db(store.db) == before
