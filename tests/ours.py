"""The Python modules of the repository that are ours, by dotted name: the packages
``runner/``, ``bench/``, ``harness/``, ``tests/`` and ``model/``, the documentation's build
hooks (``docs/*.py``) and the root's scripts (``run.py``).

Not ours: virtual environments (``.venv``, ``bench/.venv``), the built site (``site/``),
build and cache directories.  ``tests/test_import_graph.py`` (no import circle) and
``tests/test_module_size.py`` (no module over 500 lines) check this set."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: directories whose Python files (at any depth) are ours
PACKAGES = ("runner", "bench", "harness", "tests", "model", "docs")
#: directories never walked into: environments, builds, caches
NOT_OURS = {".venv", "venv", "site", "build", "dist", "__pycache__", "node_modules"}


def module_name(path: Path) -> str:
    """``runner/io/stores.py`` is ``runner.io.stores``; a package's ``__init__.py`` is the
    package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _skipped(path: Path) -> bool:
    return any(part in NOT_OURS or part.startswith(".") or part.endswith(".egg-info")
               for part in path.relative_to(ROOT).parts[:-1])


def our_modules() -> dict[str, Path]:
    """Every Python module of ours, by dotted name."""
    paths = sorted(ROOT.glob("*.py"))
    for package in PACKAGES:
        paths += sorted(p for p in (ROOT / package).rglob("*.py") if not _skipped(p))
    return {module_name(p): p for p in paths}
