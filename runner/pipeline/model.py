"""The staged-processing vocabulary (SPEC P1-P4): stages, levels, processors' identity,
outcomes, claims.  Pure data, no I/O, cheap to import (``status`` uses it).

::

    level D1 --core_processing--> D2 --generic_materialization--> D3 --domain_projection--> D4
    source --raw_ingestion--> D1

An *input* is a record of one level; a *processor* (name, version, capability) of the
stage that reads that level gives it exactly one durable *outcome* per (input, processor,
version): ``output``, ``no_output``, ``not_applicable``, ``unsupported`` or ``failed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from runner.errors import RunnerError


class Stage(StrEnum):
    RAW_INGESTION = "raw_ingestion"
    CORE_PROCESSING = "core_processing"
    GENERIC_MATERIALIZATION = "generic_materialization"
    DOMAIN_PROJECTION = "domain_projection"

    @property
    def input_level(self) -> int:
        """The level this stage reads (0: the source, outside the store's levels)."""
        return _INPUT_LEVEL[self]

    @property
    def output_level(self) -> int:
        return self.input_level + 1


_INPUT_LEVEL = {
    Stage.RAW_INGESTION: 0,
    Stage.CORE_PROCESSING: 1,
    Stage.GENERIC_MATERIALIZATION: 2,
    Stage.DOMAIN_PROJECTION: 3,
}
STAGES: tuple[Stage, ...] = tuple(Stage)
LEVELS = (1, 2, 3, 4)

OutcomeKind = Literal["output", "no_output", "not_applicable", "unsupported", "failed"]
OUTCOME_KINDS: tuple[OutcomeKind, ...] = (
    "output", "no_output", "not_applicable", "unsupported", "failed")


#: further ahead than any lease or retry time runner sets (each at most a day): a claim
#: or retry time in the store beyond ``now`` plus this was written by a clock that ran
#: ahead (a test's ``--now``, a host whose clock jumped), and counts as due now, so no
#: input waits for that clock to come back
CLOCK_HORIZON_MS = 2 * 86_400_000
#: the longest lease or retry delay a worker may set
MAX_DELAY_SECONDS = 86_400.0


class LeaseLost(RunnerError):
    """A completion or renewal under a lease that is no longer ours (expired, or taken by
    another worker with a newer fencing token).  Nothing was written."""

    exit_code = 75
    reason = "lease_lost"


class ProcessorRef(NamedTuple):
    """A processor's identity as the store knows it."""

    name: str
    version: int
    stage: Stage
    capability: str
    #: does a new version put inputs terminal under an older version back in its backlog?
    rebacklog_on_version_bump: bool = True

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def canonical(value: Any) -> str:
    """The stored form of a payload: equal content, equal bytes (idempotent rewrites)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


class WorkerConfigView(NamedTuple):
    """A worker's configuration as ``status`` shows it (P10: desired, effective, error)."""

    worker: str
    desired: Any
    effective: Any
    error: str | None
    updated_at: str


class LevelCounts(NamedTuple):
    """How many records each level holds (``{level: count}``) and how many history rows
    (level 0), as ``status`` shows them."""

    records: dict[int, int]
    history: int


def stage_of(name: str) -> Stage:
    try:
        return Stage(name)
    except ValueError:
        raise ValueError(f"unknown stage {name!r}") from None


def refs_by_stage(refs: Sequence[ProcessorRef]) -> dict[Stage, list[ProcessorRef]]:
    out: dict[Stage, list[ProcessorRef]] = {stage: [] for stage in STAGES}
    for ref in refs:
        out[ref.stage].append(ref)
    return out


def merge_fields(
    current: Mapping[str, Any] | None, orders: Mapping[str, int] | None,
    incoming: Mapping[str, Any], order: int,
) -> tuple[dict[str, Any], dict[str, int]]:
    """Merge ``incoming`` (written with ``order``) into a record, field by field: a field
    takes the incoming value unless it holds one written with a higher order.  Facts can
    thus land in any order, and landing twice changes nothing."""
    payload = dict(current or {})
    seen = dict(orders or {})
    for name, value in incoming.items():
        if name not in seen or order >= seen[name]:
            payload[name] = value
            seen[name] = order
    return payload, seen


#: D4 records of the built-in lead funnel live under this key prefix (``status`` counts
#: them); their payload is ``{"form_id", "status", "counted"}``
FUNNEL_KEY_PREFIX = "funnel:"


# -- what one processor round handles (SPEC P2-P5): outcomes and their outputs, claimed
# items, claims, completions, and the records raw ingestion reads and writes.  The plain
# records are named tuples: ``status`` imports this module, and a frozen dataclass costs
# it ~0.6 ms to build, a named tuple ~0.1 ms


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


class Item(NamedTuple):
    """One claimed input: a record of the stage's input level, at revision ``rev``."""

    work_id: int
    input_id: int
    key: str
    payload: Mapping[str, Any]
    rev: int
    attempts: int


class Claim(NamedTuple):
    """A batch claimed under one lease: ``token`` is its fencing token."""

    ref: ProcessorRef
    owner: str
    token: int
    items: tuple[Item, ...]
    expires_ms: int


class Completion(NamedTuple):
    """What a completion writes for one item: its outcome, and the work row's next state
    (``done``, or ``pending`` again at ``available_ms`` for a retryable failure)."""

    work_id: int
    input_id: int
    outcome: Outcome
    state: Literal["done", "pending"]
    available_ms: int


class NewRecord(NamedTuple):
    """A D1 record from raw ingestion (written once under its natural key)."""

    key: str
    payload: Mapping[str, Any]


class OutboxEvent(NamedTuple):
    """A lead outbox event as raw ingestion reads it (never contact fields)."""

    seq: int
    kind: str
    subject: str | None
    payload: Mapping[str, Any]
    at: str
    form_id: str | None
