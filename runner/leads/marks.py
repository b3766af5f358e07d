"""Batch marks: a fencing token the target keeps, so that a store that forgot what it sent
cannot send it twice (SPEC E8, issue 30; the rule: docs/reference/contract.md, E8).

A store has an identity (``store_id``, random, made with the store) and a mark: an
*epoch* and a *counter*, carried as one number ``seq = epoch << 32 | counter``.  Every
in-flight mark of a batch takes the store's next counter in the transaction that marks the
batch in flight, so the store remembers every seq it may have sent.  The mark travels with
its batch (:class:`BatchMark`) to a target that declares ``marks_batches = True``, which
keeps, in the transaction that applies the rows, the batch's owner (the store that marked
it first, or adopted it) and the highest seq it applied (:class:`TargetMark`), and refuses,
applying nothing, a batch of another store (:class:`ForeignMark`) or one whose seq is not
newer (:class:`StaleMark`).

A store that finds the target ahead of it (a promoted asynchronous standby lost its last
commits, a store restored from a backup) or owned by a store it adopted begins a new epoch
above both (``max(own, target's) + 1``, counter 0), *raises the target's fence* to it with
a row-less mark first (:func:`raise_mark`: from then on, a request of the forgotten history
that is still on its way is refused as stale), and only then reads back everything it
could have sent (``runner.tasks.rewind``): what the target provably lacks is sent, nothing
else.

What an adapter implements to mark (all four, with ``marks_batches = True``)::

    read_mark() -> TargetMark              what the target holds (TargetMark(None, 0): no
                                           marked batch yet); reads only
    write_batch(items, mark=BatchMark)     as write_batch, applied atomically with the
                                           check and the new mark (:func:`judge`): raise
                                           StaleMark when the mark is not the next of the
                                           epoch held, ForeignMark when the owner is
                                           another store, applying nothing
    raise_mark(mark, replaces) -> TargetMark
                                           the fence alone (mark.seq's counter is 0), with
                                           no rows, judged the same way in one transaction
                                           (an owner equal to ``replaces``, an adopted
                                           store, is replaced by mark.store_id); returns
                                           the mark it replaced
    read_by_keys(keys) -> rows             every row whose (tenant, source_lead_id) is one
                                           of ``keys``, whatever its write_id

The conformance kit proves all four (``runner.testing``: ``Report.marks_proven``).
"""

from __future__ import annotations

from collections.abc import Sequence

from runner.ids import COUNTER_MAX as COUNTER_MAX
from runner.ids import EPOCH_SHIFT as EPOCH_SHIFT
from runner.ids import NO_MARK as NO_MARK
from runner.ids import BatchMark as BatchMark
from runner.ids import Key as Key
from runner.ids import TargetMark as TargetMark
from runner.ids import counter_of as counter_of
from runner.ids import epoch_of as epoch_of
from runner.ids import in_words as in_words
from runner.ids import seq_of as seq_of
from runner.leads.capabilities import marks as marks
from runner.leads.port import BeforeWriteError, TargetRow


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


def judge(held: TargetMark, mark: BatchMark, replaces: str | None = None) -> None:
    """The target's rule for one marked request, for adapters to call in the transaction
    that applies it: raises ForeignMark or StaleMark (apply nothing), returns when the
    request may apply (then keep ``TargetMark(mark.store_id, mark.seq)``).

    A mark whose counter is 0 is a *fence* (``raise_mark``): it applies only above the
    mark held, so it begins an epoch no request sent before it can belong to.  Any other
    mark is a *batch*: it applies only in the epoch of the fence held, above the counter
    held.  So a request of a forgotten history still on its way when a fence was raised
    (its epoch is older) never applies after it, even if its seq is higher (a history
    that began an epoch of the same number the fence now has is the reason the epoch must
    be equal, not only lower or higher)."""
    if held.owner is not None and held.owner != mark.store_id and held.owner != replaces:
        raise ForeignMark(f"the target belongs to store {held.owner[:12]}, not to "
                          f"{mark.store_id[:12]}", held=held)
    if held.owner != mark.store_id:
        return  # a first mark, or an adopted store's fence: nothing of this store held
    if counter_of(mark.seq) == 0:
        if mark.seq <= held.seq:
            raise StaleMark(f"the target holds batch {in_words(held.seq)} of this store, "
                            f"not older than the fence {in_words(mark.seq)}", held=held)
    elif epoch_of(mark.seq) != epoch_of(held.seq) or mark.seq <= held.seq:
        raise StaleMark(f"the target holds batch {in_words(held.seq)} of this store; batch "
                        f"{in_words(mark.seq)} is not the next of its epoch", held=held)


def rows_by_key(rows: Sequence[TargetRow]) -> dict[Key, list[TargetRow]]:
    """Rows grouped by their business key."""
    found: dict[Key, list[TargetRow]] = {}
    for row in rows:
        key = (str(row.fields.get("tenant")), str(row.fields.get("source_lead_id")))
        found.setdefault(key, []).append(row)
    return found
