"""Names a module re-exports from another module, imported on first use (PEP 562).

A package face can then offer names whose modules are heavy (pydantic models) without
loading them for a command that never uses them, such as ``status``: ``runner`` (the
library API) and ``runner.candidates``.  Only there: ``python -X importtime`` shows the
eager import of ``runner.worker`` or ``runner.candidates.model`` costing tens of ms
(pydantic), where everything else costs under 5 ms.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def reexport(owner: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``owner``: reading a name of ``where`` imports the
    module it maps to and returns that module's attribute of the same name."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")

    return __getattr__


def from_module(source: str, names: Iterable[str]) -> dict[str, str]:
    """``where`` for names that all live in ``source``."""
    return dict.fromkeys(names, source)
