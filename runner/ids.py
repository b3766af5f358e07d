"""Identifier types, kept apart from the pydantic models so that light commands
(``status``) never pay for building them."""

from dataclasses import dataclass
from typing import NewType

WriteId = NewType("WriteId", str)


# -- batch marks (SPEC E8, issue 30): the data, light; the rule is runner.leads.marks --

#: bits of a seq below its epoch
EPOCH_SHIFT = 32
#: the most batches one epoch may mark
COUNTER_MAX = (1 << EPOCH_SHIFT) - 1

Key = tuple[str, str]
"""A lead's business key at the target: (tenant, source_lead_id)."""


def seq_of(epoch: int, counter: int) -> int:
    """The seq of an epoch's counter."""
    return epoch << EPOCH_SHIFT | counter


def epoch_of(seq: int) -> int:
    """The epoch a seq belongs to."""
    return seq >> EPOCH_SHIFT


def counter_of(seq: int) -> int:
    """The counter of a seq within its epoch."""
    return seq & COUNTER_MAX


def in_words(seq: int) -> str:
    """A seq as an operator reads it: ``epoch.counter``."""
    return f"{epoch_of(seq)}.{counter_of(seq)}"


@dataclass(frozen=True)
class BatchMark:
    """What a marked batch (or a row-less fence) carries: the store's identity and the
    batch's seq."""

    store_id: str
    seq: int


@dataclass(frozen=True)
class TargetMark:
    """What a target holds: the store it belongs to (None: no marked batch applied yet) and
    the highest seq it applied from it (0: none)."""

    owner: str | None
    seq: int


NO_MARK = TargetMark(None, 0)
