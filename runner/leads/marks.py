"""Batch marks: a fencing token the target keeps, so that a store that forgot what it sent
cannot send it twice (SPEC E8, issue 30; the design: docs/reference/contract.md, E8).

Every in-flight mark takes the store's next ``batch_seq``; the mark travels with its batch
(:class:`BatchMark`) to a target that declares ``marks_batches = True``, which keeps, in the
transaction that applies the rows, its owner (the store that marked it first, or adopted it)
and the highest seq it applied (:class:`TargetMark`), and refuses, applying nothing, a batch
of another store (:class:`ForeignMark`) or one whose seq is not newer (:class:`StaleMark`).
A request from a forgotten history (a promoted standby's lost commits, a restored backup)
can then never apply after the store decided to send again.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.leads.port import BeforeWriteError


@dataclass(frozen=True)
class BatchMark:
    """What a marked batch carries: the store's identity and the batch's seq."""

    store_id: str
    seq: int


@dataclass(frozen=True)
class TargetMark:
    """What a target holds: the store it belongs to (None: no marked batch applied yet) and
    the highest seq it applied from it (0: none)."""

    owner: str | None
    seq: int


class StaleMark(BeforeWriteError):
    """The target refused a batch whose mark is not newer than the one it holds; it applied
    nothing.  ``held``: what it holds."""

    reason = "stale_mark"
    failure = "stale_mark"

    def __init__(self, message: str, *, held: TargetMark) -> None:
        super().__init__(message)
        self.held = held


class ForeignMark(BeforeWriteError):
    """The target belongs to another store; it applied nothing.  ``held``: what it
    holds."""

    reason = "foreign_mark"
    failure = "foreign_mark"

    def __init__(self, message: str, *, held: TargetMark) -> None:
        super().__init__(message)
        self.held = held
