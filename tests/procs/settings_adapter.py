"""``--target-adapter`` factories that take runner's settings (issue 29 point 5).

Each delivers as the example adapter does (JSON rows in the ``--target`` SQLite file)
and writes what it received to ``TARGET.settings.json``, so a test reads it whether the
command ran in process or in a real process.  The token is a test's synthetic one.
"""

from __future__ import annotations

import json
from pathlib import Path

from runner import TargetSettings
from tests.procs.example_adapter import JsonRowsTarget


def _record(target: str | None, settings: TargetSettings, how: str) -> JsonRowsTarget:
    if not target:
        raise ValueError("--target names the rows file")
    if "refuse" in settings.options:  # a factory checks its own options
        raise ValueError("this adapter takes no option 'refuse'")
    Path(target + ".settings.json").write_text(json.dumps({
        "how": how,
        "token": settings.token.decode() if settings.token is not None else None,
        "timeout": settings.timeout,
        "options": dict(settings.options),
        "repr": repr(settings),
    }), encoding="utf-8")
    return JsonRowsTarget(target)


def make(target: str | None, settings: TargetSettings) -> JsonRowsTarget:
    """A second positional parameter named ``settings``."""
    return _record(target, settings, "positional")


def make_keyword(target: str | None, *, settings: TargetSettings) -> JsonRowsTarget:
    """A keyword-only ``settings``."""
    return _record(target, settings, "keyword")


class Rows(JsonRowsTarget):
    """A class as the factory: ``__init__(target, settings)``."""

    def __init__(self, target: str | None, settings: TargetSettings) -> None:
        _record(target, settings, "class")
        super().__init__(str(target))


def make_other(target: str | None, extra: object = None) -> JsonRowsTarget:
    """A second parameter with another name: not a settings parameter (called with the
    target alone)."""
    assert extra is None
    return JsonRowsTarget(str(target))


def received(target: Path) -> dict[str, object]:
    """What the factory received for ``target`` (read by the tests)."""
    found: dict[str, object] = json.loads(
        Path(str(target) + ".settings.json").read_text(encoding="utf-8"))
    return found
