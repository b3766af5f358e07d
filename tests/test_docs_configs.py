"""The configuration files the docs show pass their own tools (issue 31, point 2): the
example systemd unit passes ``systemd-analyze verify`` (Debian's ``systemd`` package),
and every TOML example parses with ``tomllib`` and is a configuration runner takes.
(The Prometheus rules and scrape config are checked by promtool in
``tests/test_http_promtool.py``.)  Each block is read from its page, never copied.

``systemd-analyze verify`` checks a unit's syntax, every key and value, and that the
``ExecStart`` program exists and is executable; a value it cannot parse (a comment after
``WatchdogSec=120``: systemd has no inline comments) is a warning on stderr with exit 0,
so a warning fails the test too.  The page's unit runs ``/srv/runner/.venv/bin/runner``
(its example layout): the test points ``ExecStart`` at the runner under test and changes
nothing else.  Without ``systemd-analyze`` the unit test skips, unless
``RUNNER_REQUIRE_SYSTEMD=1`` (``.ci/run`` sets it), which makes that a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_main

pytestmark = pytest.mark.timeout(60)

REQUIRE_ENV = "RUNNER_REQUIRE_SYSTEMD"
UNIT_PAGE = ROOT / "docs" / "how-to" / "operate.md"
#: the program the page's unit runs, in its example layout
EXAMPLE_RUNNER = "/srv/runner/.venv/bin/runner"
DOC_PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", page.read_text(encoding="utf-8"),
                      re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"systemd-analyze is not installed; {REQUIRE_ENV}=1 requires it")
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd); "
                    f"set {REQUIRE_ENV}=1 to make this a failure")
    return found


def verify(tool: str, unit: str, where: Path) -> subprocess.CompletedProcess[str]:
    path = where / "runner.service"
    path.write_text(unit.replace(EXAMPLE_RUNNER, str(Path(sys.prefix) / "bin" / "runner")),
                    encoding="utf-8")
    return subprocess.run([tool, "verify", str(path)], capture_output=True, text=True,
                          timeout=30, check=False, env={**os.environ, "SYSTEMD_PAGER": ""})


def the_unit() -> str:
    units = [b for b in blocks(UNIT_PAGE, "ini") if "[Service]" in b]
    assert len(units) == 1, f"{UNIT_PAGE.name}: expected one unit file"
    assert EXAMPLE_RUNNER in units[0]
    return units[0]


def test_the_docs_systemd_unit_passes_systemd_analyze_verify(
        systemd_analyze: str, tmp_path: Path) -> None:
    done = verify(systemd_analyze, the_unit(), tmp_path)
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def test_a_comment_after_a_value_is_what_the_check_catches(
        systemd_analyze: str, tmp_path: Path) -> None:
    """The check would have failed the page before issue 31: the old unit's comment after
    ``WatchdogSec=120`` makes systemd drop the value, with a warning."""
    unit = re.sub(r"^WatchdogSec=120$", "WatchdogSec=120            # several cycles",
                  the_unit(), flags=re.MULTILINE)
    done = verify(systemd_analyze, unit, tmp_path)
    assert "Failed to parse sec value" in done.stderr, done.stdout + done.stderr


def toml_examples() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}#{i}", text) for page in DOC_PAGES
            for i, text in enumerate(blocks(page, "toml"), 1)]


@pytest.mark.parametrize(("where", "text"), toml_examples(), ids=lambda v: v[:40])
def test_every_toml_example_parses_and_runner_takes_it(
        where: str, text: str, tmp_path: Path) -> None:
    tomllib.loads(text)  # raises on the first error, with its line
    path = tmp_path / "runner.toml"
    path.write_text(text, encoding="utf-8")
    # a fragment (a [target] table alone) needs the required flags: a flag wins over
    # the file, and every key of the file is checked all the same
    shown = run_main("config", "show", "--config", path, "start", "--db", "q.db",
                     "--scope", "s.json", cwd=tmp_path)
    assert shown.returncode == 0, f"{where}: {shown.stderr}"


def test_the_docs_show_toml_examples() -> None:
    assert len(toml_examples()) >= 3  # the configuration reference's two, the adapter's
