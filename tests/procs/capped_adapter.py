"""The example adapter with a ``max_batch`` of its own, for ``--target-adapter`` tests: one
that takes at most two records a request, and ones that declare a limit runner refuses."""

from __future__ import annotations

from typing import Any

from tests.procs.example_adapter import JsonRowsTarget


class Capped(JsonRowsTarget):
    max_batch: Any = 2


def make(target: str | None) -> Capped:
    return Capped(target or "rows.db")


def zero(target: str | None) -> Capped:
    adapter = make(target)
    adapter.max_batch = 0
    return adapter


def text(target: str | None) -> Capped:
    adapter = make(target)
    adapter.max_batch = "100"
    return adapter
