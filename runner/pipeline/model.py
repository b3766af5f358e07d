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
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from runner.errors import RunnerError
from runner.lazy import reexport

if TYPE_CHECKING:
    from runner.pipeline.work import Claim as Claim
    from runner.pipeline.work import Completion as Completion
    from runner.pipeline.work import Item as Item
    from runner.pipeline.work import NewRecord as NewRecord
    from runner.pipeline.work import OutboxEvent as OutboxEvent
    from runner.pipeline.work import Outcome as Outcome
    from runner.pipeline.work import Output as Output
    from runner.pipeline.work import failed as failed
    from runner.pipeline.work import no_output as no_output
    from runner.pipeline.work import not_applicable as not_applicable
    from runner.pipeline.work import output as output
    from runner.pipeline.work import unsupported as unsupported

#: what a processor round handles (outcomes, claims, records in flight) lives in
#: ``runner.pipeline.work`` and is importable from here too, loaded on first use: the
#: adapters' status path never builds those classes
__getattr__ = reexport(__name__, "runner.pipeline.work", (
    "Claim", "Completion", "Item", "NewRecord", "Outcome", "OutboxEvent", "Output",
    "failed", "no_output", "not_applicable", "output", "unsupported"))


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


@dataclass(frozen=True)
class ProcessorRef:
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


@dataclass(frozen=True)
class WorkerConfigView:
    """A worker's configuration as ``status`` shows it (P10: desired, effective, error)."""

    worker: str
    desired: Any
    effective: Any
    error: str | None
    updated_at: str


@dataclass
class LevelCounts:
    records: dict[int, int] = field(default_factory=dict)
    history: int = 0


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
