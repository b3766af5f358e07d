"""Outbox retention (SPEC K3, E6; issue 15 point 11): export, a watermark, and a prune
that keeps the sequence's meaning.

The outbox is the lead workload's history and the raw retriever's source, and it grows
with every event (about 150,000 events in a 12-minute soak).  Retention removes the
oldest events, deliberately and on the record, and never what someone still needs:

* ``runner outbox export --after SEQ`` prints the events after SEQ as NDJSON, in
  sequence order, from one consistent snapshot.  A consumer keeps its own watermark (the
  last ``seq`` it stored) and asks from there next time; ``--commit-watermark`` also
  records the last printed ``seq`` in the store as the *export watermark*, once the
  lines are written and flushed.  ``runner outbox watermark --set SEQ`` records one
  (for a consumer that confirms after storing the lines durably: the safer order).
* ``runner outbox prune --before SEQ`` removes events with ``seq < SEQ``, in one
  transaction that first records the new *floor* (the highest pruned ``seq``) and what
  it removed (``outbox_prunes``).  The floor is the lowest of: ``SEQ - 1``; the export
  watermark, once one is recorded; what the raw retriever has read (its cursor) and
  ingested (the first lead event not in D1, minus one), so a store whose pipeline never
  ran keeps its outbox (run ``job backfill`` or the retriever first); and the newest
  event minus one (the newest event is always kept, so the sequence goes on from it on
  SQLite as on PostgreSQL).  ``limited_by`` in the answer says which bound applied.

The schema enforces the same rules (migration v7, both backends): a DELETE of an event
above the recorded floor raises; the floor only moves up, never past the export
watermark, the retriever's cursor or the newest event; the watermark only moves forward.

What readers see after a prune: ``read from a sequence onward`` works for every sequence
at or above the floor, with no gap; a read asking from below the floor raises
:class:`runner.errors.OutboxPruned` (exit 65) instead of returning a shorter stream.
``status`` counts the events still in the store (``outbox.count``, ``outbox.by_kind``),
keeps ``outbox.last_seq`` as the last sequence ever handed out, and, once something was
pruned, shows ``outbox.pruned`` (``floor``, ``count``, ``by_kind``): kept + pruned = every
event ever written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, Protocol

Bound = Literal["requested", "export_watermark", "raw_retriever", "newest_event"]


class RetentionState(NamedTuple):
    """The outbox's retention bookkeeping."""

    floor: int  # every event with seq <= floor has been pruned (0: none)
    export_watermark: int | None  # None: no export watermark recorded
    pruned: int
    pruned_by_kind: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"floor": self.floor, "export_watermark": self.export_watermark,
                "pruned": self.pruned, "pruned_by_kind": self.pruned_by_kind}


class PruneFacts(NamedTuple):
    """What a prune is decided from, read inside its transaction."""

    floor: int
    export_watermark: int | None
    retriever_cursor: int  # 0: the raw retriever never read the outbox
    first_uningested: int | None  # the first lead event behind the cursor not in D1
    last_seq: int


class PrunePlan(NamedTuple):
    """Where a prune moves the floor to, and the bound that chose it."""

    floor: int  # the new floor (== facts.floor: nothing to prune)
    limited_by: Bound


def plan_prune(before: int, facts: PruneFacts) -> PrunePlan:
    """The new floor for ``prune --before before``: the lowest bound wins."""
    bounds: list[tuple[int, Bound]] = [(before - 1, "requested"),
                                       (facts.last_seq - 1, "newest_event")]
    if facts.export_watermark is not None:
        bounds.append((facts.export_watermark, "export_watermark"))
    retriever = facts.retriever_cursor
    if facts.first_uningested is not None:
        retriever = min(retriever, facts.first_uningested - 1)
    bounds.append((retriever, "raw_retriever"))
    floor, bound = min(bounds, key=lambda b: b[0])
    return PrunePlan(max(floor, facts.floor), bound)


class PruneResult(NamedTuple):
    """What a prune removed: how many events, per kind, and where the floor moved."""

    pruned: int
    floor: int
    previous_floor: int
    limited_by: Bound
    by_kind: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"pruned": self.pruned, "floor": self.floor,
                "previous_floor": self.previous_floor, "limited_by": self.limited_by,
                "by_kind": self.by_kind}


def below_floor(after_seq: int, floor: int) -> str | None:
    """Why a read from ``after_seq`` onward is refused (None: it is not)."""
    if after_seq < floor:
        return (f"the outbox was pruned through seq {floor}: events after {after_seq} up to "
                f"{floor} are gone (exported before the prune); read from {floor} onward")
    return None


class RetentionStore(Protocol):
    """The store operations of outbox retention (both adapters, migration v7)."""

    async def export_outbox(self, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Events after ``after_seq`` in sequence order, at most ``limit``, whole
        (``seq, kind, subject, payload, at``); OutboxPruned below the floor."""
        ...

    async def check_outbox_floor(self, after_seq: int) -> None:
        """Raise OutboxPruned if events after ``after_seq`` were pruned."""
        ...

    async def retention_state(self) -> RetentionState: ...

    async def set_export_watermark(self, seq: int, at: str) -> int:
        """Record the export watermark (forward only); the one now recorded."""
        ...

    async def prune_outbox(self, before: int, kinds: Sequence[str], at: str) -> PruneResult:
        """Remove events with ``seq < before`` within every bound, in one transaction."""
        ...
