"""Start-up: ``status`` and ``once`` import only what they need (issue 9 point 7, issue 32
point 2).

What matters is wall time, but tests never assert on time: this checks the cause instead.
A ``status`` of a SQLite store, run in a fresh interpreter, must not load a driver or a
model it does not use, the other commands' modules, the pipeline engine or the write
paths' data.  A new top-level import on the status path that pulls one of these in
fails here, with the list of what it loaded.  The same for a ``once`` with nothing to
do on a store whose scope is pinned: no model (pydantic is the largest part of its
start-up), no intake, no other command's module; the models load with the first record
it maps (``bench/startup.py`` measures what the start costs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from runner import cli
from runner.io.stores import open_store
from tests.helpers import ROOT, SCOPE

#: loaded by ``status`` on a SQLite store: never
NOT_ON_STATUS_PATH = (
    "asyncpg",
    "pydantic",
    "runner.leads.models",
    "runner.store",
    "runner.worker",
    "runner.leads.intake",
    "runner.jsonio",
    "runner.crashpoints",
    "runner.commands.delivery",
    "runner.commands.delivery_options",
    "runner.commands.candidates",
    "runner.commands.pipeline",
    "runner.candidates.model",
    "runner.candidates.port",
    "runner.candidates.rules",
    "runner.pipeline.engine",
    "runner.pipeline.funnel",
    "runner.pipeline.port",
    "runner.tasks.sweep",
    "runner.io.filelock",
    # argparse's own help formatter imports it for the terminal width (with zlib, bz2 and
    # lzma: milliseconds); runner's formatter reads the width itself
    "shutil",
)

_PROBE = (
    "import json, sys\n"
    "from runner.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


#: loaded by a ``once`` with an empty backlog on a SQLite store with its scope pinned: never
NOT_ON_IDLE_ONCE_PATH = (
    "asyncpg",
    "httpx",
    "pydantic",
    "pydantic_core",
    "runner.leads.models",
    "runner.leads.intake",
    "runner.commands.candidates",
    "runner.commands.pipeline",
    "runner.commands.operators",
    "runner.candidates.model",
    "runner.candidates.rules",
    "runner.pipeline.engine",
    "runner.pipeline.funnel",
    "shutil",
)


async def _empty_store(db: Path) -> None:
    async with await open_store(str(db)):
        pass


def _loaded(args: list[str]) -> tuple[str, set[str]]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=50, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, set(json.loads(proc.stderr.strip().splitlines()[-1]))


def _among(loaded: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.timeout(60)
def test_status_loads_nothing_it_does_not_use(workdir: Path) -> None:
    db = workdir / "q.db"
    anyio.run(_empty_store, db)
    out, loaded = _loaded(["status", "--db", str(db)])
    assert json.loads(out)["counts"]["prepared"] == 0
    assert "runner.io.sqlite.store" in loaded  # the probe really read the store
    assert _among(loaded, NOT_ON_STATUS_PATH) == []


@pytest.mark.timeout(60)
def test_an_idle_once_loads_no_model(workdir: Path) -> None:
    db, target, scope = workdir / "q.db", workdir / "t.db", workdir / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    args = ["once", "--db", str(db), "--scope", str(scope), "--target", str(target)]
    _loaded(args)  # the first run creates the store and pins the scope (and validates it)
    out, loaded = _loaded(args)
    assert json.loads(out)["dispatched"] == 0
    # the probe really opened the store, checked the target and ran a cycle
    assert {"runner.io.sqlite.store", "runner.io.synthetic_target", "runner.cycles"} <= loaded
    assert _among(loaded, NOT_ON_IDLE_ONCE_PATH) == []


def test_the_command_table_names_every_command_and_its_module() -> None:
    full = cli.build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    assert list(cli.COMMANDS) == list(sub.choices)
    assert set(cli.COMMANDS.values()) == set(cli.COMMAND_MODULES)
    for command, module in cli.COMMANDS.items():
        # the reduced parser knows the command and parses and documents it the same way
        alone = cli.build_parser([command])
        alone_sub = next(a for a in alone._actions if a.dest == "command")
        assert isinstance(alone_sub.choices, dict)
        assert command in alone_sub.choices, (command, module)
        assert (alone_sub.choices[command].format_help()
                == sub.choices[command].format_help()), command


@pytest.mark.parametrize("columns", ["", "50", "200", "nonsense"])
def test_the_help_reads_as_argparse_formats_it(
        columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """runner's formatter reads the terminal width without ``shutil``; every command's
    help is the text argparse's own formatter gives for the same ``$COLUMNS``."""
    import argparse

    monkeypatch.setenv("COLUMNS", columns)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    for each in [parser, *sub.choices.values()]:
        ours = each.format_help()
        each.formatter_class = argparse.HelpFormatter
        assert ours == each.format_help(), each.prog
