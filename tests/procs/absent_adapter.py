"""The example adapter over a table that must exist already (its owner makes it): a
missing one is ``TargetAbsent``, the case the how-to describes, for ``--target-adapter``
tests.  The "table" is the rows file; the adapter never creates it."""

from __future__ import annotations

import os

from runner.errors import TargetAbsent
from tests.procs.example_adapter import JsonRowsTarget


class OwnedTable(JsonRowsTarget):
    def _there(self) -> None:
        if not os.path.exists(self.path):
            raise TargetAbsent(f"no table at {self.path} (its owner creates it)")

    def target_id(self) -> str:
        self._there()
        return f"table-{os.path.basename(self.path)}"

    def prepare_writes(self, create: bool) -> None:
        self._there()


def make(target: str | None) -> OwnedTable:
    return OwnedTable(target or "rows.db")
