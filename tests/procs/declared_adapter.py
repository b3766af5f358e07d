"""The example adapter with declarations of its own, for ``--target-adapter`` tests: a
``max_read`` of two (its reads refuse more, as a service refuses a URL that is too long),
and ones that declare what runner refuses (a bad ``max_read``, a ``dedupes_write_id`` that
is not a bool)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runner.leads.port import Observation, TargetReadError, TargetRow
from tests.procs.example_adapter import JsonRowsTarget


class ReadCapped(JsonRowsTarget):
    max_read: Any = 2

    def _refuse_more(self, write_ids: Sequence[str]) -> None:
        if len(write_ids) > 2:
            raise TargetReadError(f"431: {len(write_ids)} write_ids in one read")

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self._refuse_more(write_ids)
        return super().read_back_many(write_ids)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        self._refuse_more(write_ids)
        return super().observe_status(write_ids)


def make(target: str | None) -> ReadCapped:
    return ReadCapped(target or "rows.db")


def zero(target: str | None) -> ReadCapped:
    adapter = make(target)
    adapter.max_read = 0
    return adapter


def text(target: str | None) -> ReadCapped:
    adapter = make(target)
    adapter.max_read = "400"
    return adapter


def says_yes(target: str | None) -> ReadCapped:
    adapter = make(target)
    adapter.dedupes_write_id = "yes"  # type: ignore[attr-defined]
    return adapter
