"""The ways into the command line: ``--version`` and ``run.py`` outside its environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import runner
from runner.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"runner {runner.__version__}\n"


def test_run_py_without_the_dependencies_says_how_to_install_them() -> None:
    # -S: no site-packages, so none of runner's dependencies can be imported
    proc = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "run.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 69
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "missing anyio, aiosqlite, pydantic" in lines[0]
    assert ".venv/bin/pip install -e ." in lines[0]
