"""The synthetic target with reads that fail or wait, for ``resolve --all`` through
``--target-adapter`` (in process and in a real process).  Each keeps the synthetic
target's identity, so a store pinned to the file takes it as its own target.

* ``per_record``: no ``read_back_many`` (runner reads one record per request); a readback
  of a write_id listed in the file ``<target>.fail`` (one a line) fails.
* ``second_chunk_fails``: one ``read_back_many`` per chunk; the second one fails.
* ``gated``: one ``read_back_many`` per chunk; the second one writes ``gated: waiting`` to
  stderr, then waits until the file ``<target>.go`` exists (so a test can signal the
  process while a chunk is being read back).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.leads.port import Observation, TargetRow

#: how long ``gated`` waits for its file at most (seconds): a test that never writes it
#: still ends
GATE_TIMEOUT = 60.0


class PerRecord:
    """The synthetic target without ``read_back_many``."""

    def __init__(self, target: str) -> None:
        self.sheet = SyntheticTarget(target)
        self.fail_path = Path(target + ".fail")

    def target_id(self) -> str:
        return self.sheet.target_id()

    def prepare_writes(self, create: bool) -> None:
        self.sheet.prepare_writes(create)

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.sheet.write(record, write_id)

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        failing = (self.fail_path.read_text().split() if self.fail_path.exists() else [])
        if write_id in failing:
            raise ConnectionError("scripted: this readback fails")
        return self.sheet.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        return self.sheet.observe_status(write_ids)

    def close(self) -> None:
        self.sheet.close()


class Chunked(PerRecord):
    """The synthetic target with ``read_back_many``, counting its calls."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.calls = 0

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.calls += 1
        self.on_call(self.calls)
        return self.sheet.read_back_many(write_ids)

    def on_call(self, n: int) -> None:
        pass


class SecondChunkFails(Chunked):
    def on_call(self, n: int) -> None:
        if n == 2:
            raise TimeoutError("scripted: the second chunk's readback timed out")


class Gated(Chunked):
    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.go = Path(target + ".go")

    def on_call(self, n: int) -> None:
        if n != 2:
            return
        sys.stderr.write("gated: waiting\n")
        sys.stderr.flush()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # a condition, re-checked: the test writes the file


def per_record(target: str | None) -> PerRecord:
    return PerRecord(target or "target.db")


def second_chunk_fails(target: str | None) -> SecondChunkFails:
    return SecondChunkFails(target or "target.db")


def gated(target: str | None) -> Gated:
    return Gated(target or "target.db")
