#!/usr/bin/env python3
"""Entry point: ``python run.py COMMAND ...`` (the same as the ``runner`` console script).

Run outside the virtual environment that has runner's dependencies, this says how to
install them in one line (exit 69, EX_UNAVAILABLE) instead of a ``ModuleNotFoundError``
traceback.
"""

import sys
from importlib.util import find_spec

#: the runtime dependencies (pyproject.toml), checked before anything imports them
REQUIRED = ("anyio", "aiosqlite", "pydantic")


def missing_dependencies() -> list[str]:
    return [name for name in REQUIRED if find_spec(name) is None]


if __name__ == "__main__":
    missing = missing_dependencies()
    if missing:
        print(
            f"runner: missing {', '.join(missing)} (this Python has not got runner's "
            "dependencies); install them with `python3 -m venv .venv && "
            ".venv/bin/pip install -e .`, then run `.venv/bin/runner` "
            "(or `.venv/bin/python run.py`)",
            file=sys.stderr,
        )
        sys.exit(69)
    from runner.cli import entry

    entry()
