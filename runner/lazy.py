"""Names a module re-exports from another module, imported on first use (PEP 562).

A light module can then offer heavier names (``runner.storedata`` the write paths'
data, ``runner.pipeline.model`` a processor round's) without building them for a command
that never uses them, such as ``status``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


def reexport(owner: str, source: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``owner``: reading one of ``names`` imports
    ``source`` and returns its attribute of that name."""
    wanted = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in wanted:
            return getattr(importlib.import_module(source), name)
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")

    return __getattr__
