"""What one processor round handles (SPEC P2-P5): outcomes and their outputs, claimed
items, claims, completions, and the records raw ingestion reads and writes.

Split from ``model.py`` (which re-exports every name here, loaded on first use) so that
reading the store for ``status`` never builds these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runner.pipeline.model import OutcomeKind, ProcessorRef


@dataclass(frozen=True)
class Output:
    """One record a processor writes into the next level, under a natural ``key``.

    ``order`` chooses how it lands on an existing record with the same key: ``None``
    replaces the whole payload; a number merges field by field, each field keeping the
    value written with the highest order (so facts may arrive in any order, and a redo
    writes the same thing).
    """

    key: str
    payload: Mapping[str, Any]
    order: int | None = None


@dataclass(frozen=True)
class Outcome:
    """The durable outcome of one (input, processor, version)."""

    kind: OutcomeKind
    outputs: tuple[Output, ...] = ()
    error: str | None = None
    retryable: bool = False

    def __post_init__(self) -> None:
        if self.outputs and self.kind != "output":
            raise ValueError("only an 'output' outcome carries outputs")
        if self.kind == "output" and not self.outputs:
            raise ValueError("an 'output' outcome needs at least one output")
        if self.kind == "failed" and not self.error:
            raise ValueError("a 'failed' outcome needs its error")


def output(*outputs: Output) -> Outcome:
    return Outcome("output", tuple(outputs))


def no_output() -> Outcome:
    return Outcome("no_output")


def not_applicable() -> Outcome:
    return Outcome("not_applicable")


def unsupported() -> Outcome:
    return Outcome("unsupported")


def failed(error: str, *, retryable: bool) -> Outcome:
    return Outcome("failed", error=error[:500], retryable=retryable)


@dataclass(frozen=True)
class Item:
    """One claimed input: a record of the stage's input level, at revision ``rev``."""

    work_id: int
    input_id: int
    key: str
    payload: Mapping[str, Any]
    rev: int
    attempts: int


@dataclass(frozen=True)
class Claim:
    """A batch claimed under one lease: ``token`` is its fencing token."""

    ref: ProcessorRef
    owner: str
    token: int
    items: tuple[Item, ...]
    expires_ms: int


@dataclass(frozen=True)
class Completion:
    """What a completion writes for one item: its outcome, and the work row's next state
    (``done``, or ``pending`` again at ``available_ms`` for a retryable failure)."""

    work_id: int
    input_id: int
    outcome: Outcome
    state: Literal["done", "pending"]
    available_ms: int


@dataclass(frozen=True)
class NewRecord:
    """A D1 record from raw ingestion (written once under its natural key)."""

    key: str
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class OutboxEvent:
    """A lead outbox event as raw ingestion reads it (never contact fields)."""

    seq: int
    kind: str
    subject: str | None
    payload: Mapping[str, Any]
    at: str
    form_id: str | None
