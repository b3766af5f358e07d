"""Bad values at the command line are usage errors (exit 2, one line), never a crash
(exit 70) later and never accepted silently; nothing is created or imported first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runner.cli import main
from tests.helpers import SCOPE, write_json

CASES = [
    (["start", "{common}", "--sweep-interval", "inf"], "--sweep-interval: 'inf' must be"),
    (["start", "{common}", "--sweep-interval", "1e308"], "'1e308' must be between 1 and"),
    (["start", "{common}", "--grace", "inf"], "--grace: 'inf' must be"),
    (["start", "{common}", "--interval", "nan"], "--interval: 'nan' must be"),
    (["start", "{common}", "--cycles", "1e3"], "'1e3' is not a whole number"),
    (["candidate", "add", "--db", "{db}", "--id", "c1", "--now", "9999-12-31T23:59Z"],
     "outside the times runner takes"),
    (["candidate", "add", "--db", "{db}", "--id", "c1", "--now", "0001-01-01T00:00+01:00"],
     "outside the times runner takes"),
    (["poll-status", "{common}", "--fault", "outage"], "outage does not apply to polling"),
    (["poll-status", "{common}", "--fault", "crash-at:dispatch.after-write"],
     "never reached by a poll pass"),
    (["worker", "raw-retriever", "--db", "{db}", "--plugin", ".x"], "is not a module name"),
    (["worker", "raw-retriever", "--db", "{db}", "--plugin", ""], "is not a module name"),
    (["backlog", "--db", "{db}", "--plugin", "no_such_runner_plugin"], "no module of that name"),
    (["status", "--db", "postgresql://u:s3cret@[::1/db"], "bad PostgreSQL DSN"),
    (["status", "--db", "postgresql://u:s3cret@host:99999/db"], "bad PostgreSQL DSN"),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(c[0][:4]) for c in CASES])
def test_a_bad_value_is_a_usage_error_that_changes_nothing(
        argv: list[str], message: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    scope = write_json(workdir / "scope.json", SCOPE)
    db, target = workdir / "queue.db", workdir / "target.db"
    common = ["--db", str(db), "--scope", str(scope), "--target", str(target)]
    args: list[str] = []
    for arg in argv:
        args.extend(common if arg == "{common}" else [arg.replace("{db}", str(db))])
    assert main(args) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert len(out.err.splitlines()) == 1 and message in out.err, out.err
    assert "s3cret" not in out.err
    assert sorted(p.name for p in workdir.iterdir()) == ["scope.json"]  # nothing created


def test_what_a_plugin_prints_on_import_never_reaches_stdout(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the standard library's ``this`` prints the Zen of Python when imported
    sys.modules.pop("this", None)
    assert main(["backlog", "--db", str(workdir / "queue.db"), "--plugin", "this"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines()[-1] == ("runner: error: plugin 'this' has no "
                                        "register(registry) function")
