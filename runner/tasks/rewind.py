"""A store behind its target (SPEC E8, issue 30): detect it, raise the target's fence,
then read back everything the forgotten history could have sent before sending any of it.

Why: the never-twice rule rests on the store remembering every in-flight mark it
committed.  A promoted asynchronous standby lost its last commits; a store restored from a
backup, or emptied and made again, lost more.  Such a store sees records as ``prepared``
that its forgotten history already sent, and would send them again.  A target that keeps
batch marks (``runner.leads.marks``) remembers for it: it holds the owner and the highest
seq it applied, and refuses, applying nothing, a batch that is not newer.

How the store finds out, at every start under the lock (:func:`check_marks`, then
:func:`fence`) and when a batch is refused (``runner.tasks.deliver``: a ``stale_mark``
ends the dispatch, :func:`refused`):

* every start raises the target's fence to a new epoch, whatever it finds: a request
  sent before it (by this history, or by one the store forgot, still on its way) can
  never apply after it.  The fence answers the mark it replaced;
* the store is behind when the mark it read, or the mark the fence replaced (a forgotten
  batch that landed between the two), is a seq of this store newer than the one the
  store remembers; or when a batch is refused as stale during a run;
* the target belongs to another store: this one is new, emptied or re-created; it is
  refused (``TargetOwned``, exit 78) until an operator adopts the target with a recorded
  decision (``runner target adopt``), and then treated as behind.

The SPIN model's REWIND variant (``model/delivery.pml``) found why the fence must be
raised at every start and report what it replaced: a store that rewinds only when the
mark it reads is ahead misses forgotten requests still on their way, which land later.

What a rewind does, in this order, each step committed before the next:

1. the target's fence is raised to a new epoch above both the store's and the target's,
   with a row-less mark (as at every start): from then on a request of the forgotten
   history still on its way is refused;
2. in one transaction, the store takes that epoch and every record that could have been
   sent (prepared, failed_safe, in_flight, uncertain) becomes uncertain, tagged
   ``rewound`` (``begin_fenced_epoch``);
3. every rewound record is read back (:func:`read_rewound`, before the reconcile pass
   and any dispatch of the cycle): by write_id, and, when that finds nothing, by its
   business key (tenant, source_lead_id), since a record accepted again after the loss
   has a new write_id.  One exact row by write_id confirms; one exact row under another
   write_id confirms too, the store taking that write_id (a kept adoption row); a row
   that differs, or two, leave it uncertain for an operator; no row at all makes it
   sendable again (a kept authorisation, evidence ``fence``), since no earlier request
   can apply any more.  A target without marks (the readback is then not conclusive)
   leaves it uncertain, unless it deduplicates by write_id (SPEC E7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from runner.clock import Clock, to_text
from runner.errors import TargetOwned, TargetUnavailable
from runner.io.engine.delivery import lead_works
from runner.leads.marks import (
    BatchMark,
    ForeignMark,
    StaleMark,
    TargetMark,
    epoch_of,
    in_words,
    rows_by_key,
    seq_of,
)
from runner.leads.pacing import Backoff
from runner.leads.port import CRMRecordPort, TargetRow, classify_readback, describe_failure
from runner.storedata import LeadWork, Requeue
from runner.tasks import target
from runner.tasks.reconcile import recover

if TYPE_CHECKING:
    from runner.store import DeliveryStore

log = logging.getLogger("runner.rewind")

#: fence raises refused as stale in a row (another worker or a copy of this store raised
#: it meanwhile) before the run stops
RAISES = 3
#: how long after a rewind the records accepted since are looked up by key before they
#: are sent: an event the forgotten history delivered, sent again by its source after
#: the rewind (with a new write_id), is found at the target instead of sent twice
KEY_CHECK = timedelta(days=1)
#: why a rewound record found with no row is sendable again (its ``last_error``)
FENCED_REASON = "resend: the target's fence stands above every batch the store forgot"


def _owned(held: TargetMark, store_id: str) -> TargetOwned:
    owner = held.owner or "?"
    return TargetOwned(
        f"the target keeps the batches of another store ({owner[:12]}, at batch "
        f"{in_words(held.seq)}), not of this one ({store_id[:12]}): this store may be new, "
        "emptied or re-created. If it replaces that store, adopt the target with "
        "'runner target adopt --reason TEXT' (with the same --db and --target); every "
        "record is then read back before anything is sent; nothing was changed")


async def take_over(store: DeliveryStore, port: CRMRecordPort | None, clock: Clock, *,
                    check_target: bool = True) -> int:
    """What a worker does each time it holds the lock, before any cycle: the target is
    checked (with a ``port`` and ``check_target``; ``runner.tasks.target``: a bad target
    stops the run before any record changes), every in-flight record becomes uncertain
    (recovery runs once per acquisition, since no other worker can leave a record in
    flight while the lock is held), and a target that keeps batch marks is compared with
    the store's (``runner.tasks.rewind``: a store behind it rewinds, a target of another
    store is refused).  Returns how many were recovered."""
    if port is not None and check_target:
        await target.check_for_writes(store, port, clock)
    recovered = await recover(store, clock)
    if port is not None:
        await check_marks(store, port, clock)
        await check_timeline(store, port, clock)
    return recovered


async def check_timeline(store: DeliveryStore, port: CRMRecordPort, clock: Clock) -> None:
    """On PostgreSQL: a server on a newer timeline than the one the store last started on
    is a promoted standby.  Under asynchronous replication (as last seen) it may lack the
    last commits; a target that keeps marks catches that itself (a stale batch), any other
    target gets a rewind without a fence: every record that could have been sent is read
    back, and one with no row stays uncertain (the readback cannot prove that no request
    of the forgotten history is still on its way), unless the target deduplicates by
    write_id (SPEC E7).  The timeline and the replication mode are recorded each time."""
    timeline = await store.server_timeline()
    if timeline is None:
        return
    own = await store.store_mark()
    mode = (await store.replication()).mode
    if own.timeline is not None and timeline > own.timeline and not port.marks:
        if own.replication == "synchronous":
            log.info("the server is on timeline %d (the store last started on %d): a "
                     "promoted standby, under synchronous replication: nothing committed was "
                     "lost", timeline, own.timeline, extra={"action": "store.promoted"})
        else:
            reason = (f"the server is on timeline {timeline}, the store last started on "
                      f"{own.timeline} under {own.replication or 'unknown'} replication: a "
                      "promoted standby may lack the last commits")
            log.warning("%s; reading back before sending (this target keeps no batch marks: "
                        "a record with no row stays uncertain)", reason,
                        extra={"action": "store.rewind", "reason": "newer_timeline"})
            await store.begin_epoch(0, reason, clock.now(), tag=True)
    await store.record_timeline(timeline, mode, clock.now())


async def check_marks(store: DeliveryStore, port: CRMRecordPort, clock: Clock) -> None:
    """At every start under the lock, on a target that keeps marks: refuse a target of
    another store unless adopted, then raise the target's fence (:func:`fence`), which
    rewinds when the store is behind the target, when it adopted it, or when a rewind
    was cut short before its fence stood."""
    if not port.marks:
        return
    own = await store.store_mark()
    port.store_id = own.store_id
    try:
        held = await port.read_mark()
    except Exception as exc:  # noqa: BLE001 - cannot tell: stop, changing nothing
        kind, words = describe_failure(exc)
        raise TargetUnavailable(f"the target's batch mark cannot be read ({kind}): "
                                f"{words}; nothing was changed") from None
    reason = None
    if held.owner is not None and held.owner != own.store_id:
        if own.adopting != held.owner:
            raise _owned(held, own.store_id)
        reason = f"adopted the target of store {held.owner[:12]}"
    elif held.owner == own.store_id and held.seq > own.seq:
        reason = _behind(held, own.seq)
    elif own.rewind is not None and not own.fenced:
        reason = own.rewind  # cut short before its fence stood: again
    await fence(store, port, clock, held, reason)


def _behind(held: TargetMark, remembered: int) -> str:
    return (f"the target holds batch {in_words(held.seq)} of this store, newer than its "
            f"own {in_words(remembered)}: the store forgot what it sent (restored from a "
            "backup, or a standby promoted before it caught up)")


async def fence(store: DeliveryStore, port: CRMRecordPort, clock: Clock, held: TargetMark,
                reason: str | None) -> None:
    """Raise the target's fence to a new epoch above ``held`` and the store's own (at
    every start, so that no request sent before it, by this history or a forgotten one,
    can apply after it), and rewind (steps 1 and 2 of the module) when ``reason`` says
    why, or when the mark the fence replaced shows batches the store does not remember
    (they landed after the target was read).  Step 3 is :func:`read_rewound`, at the
    start of each cycle until it is done.

    The store changes only once the fence stands, in one transaction: the new epoch, the
    rewind's tags when there is one, and the record that the fence stands.  So a start
    that stops half-way (the raise fails, the process dies before or after it) leaves the
    store as it was, remembering no more than before; the next start reads a target
    ahead of it (the fence, if it was raised) and rewinds.  (The delivery model found the
    duplicate that committing the epoch before the raise allowed: the store's own mark
    then moved above a forgotten batch that landed while the fence was not up.)"""
    own = await store.store_mark()
    replaces, remembered = own.adopting, own.seq
    port.fence_pending = False
    epoch = max(own.epoch, epoch_of(held.seq)) + 1
    for attempt in range(RAISES):
        try:
            replaced = await port.raise_mark(BatchMark(own.store_id, seq_of(epoch, 0)),
                                             replaces)
        except StaleMark as exc:  # raised higher meanwhile: above it, once more
            if attempt + 1 == RAISES:
                raise TargetUnavailable(f"the target's fence could not be raised: "
                                        f"{exc}") from None
            reason = reason or _forgot(exc.held, own.store_id, remembered)
            epoch = max(epoch, epoch_of(exc.held.seq)) + 1
            continue
        except ForeignMark as exc:
            raise _owned(exc.held, own.store_id) from None
        except Exception as exc:  # noqa: BLE001 - each cycle tries again; nothing sent
            kind, words = describe_failure(exc)
            port.fence_pending = True
            log.warning("the target's fence could not be raised (%s): %s; nothing is sent "
                        "until it is (each cycle tries again)", kind, words,
                        extra={"action": "store.fence_failed", "reason": kind})
            return
        reason = reason or _forgot(replaced, own.store_id, remembered)
        break
    if reason is not None:
        log.warning("the store is behind its target: %s; reading back before sending",
                    reason, extra={"action": "store.rewind", "reason": "behind_target"})
    now = clock.now()
    await store.begin_fenced_epoch(epoch, reason, now, until=now + KEY_CHECK)
    log.debug("fence raised at epoch %d", epoch,
              extra={"action": "store.fenced", "count": epoch})


def _forgot(found: TargetMark, store_id: str, remembered: int) -> str | None:
    """Why a mark found while raising the fence shows that the store forgot (a batch of
    this store newer than the one it remembers, which landed after the target was read);
    None: it does not."""
    if found.owner != store_id or found.seq <= remembered:
        return None
    return _behind(found, remembered)


@dataclass
class Rewound:
    """What a pass over the rewound records did."""

    read: int = 0
    confirmed: int = 0
    adopted: int = 0
    requeued: int = 0
    uncertain: int = 0
    done: bool = False


async def check_keys(store: DeliveryStore, port: CRMRecordPort, clock: Clock) -> None:
    """Within a day of a rewind (``KEY_CHECK``), on a target that keeps marks: every
    record about to be sent is first tagged like a rewound one, so that
    :func:`read_rewound` looks it up by key behind the fence (an event the forgotten
    history delivered may come again under a new write_id) before it is sent."""
    if not port.marks or port.fence_pending:
        return
    own = await store.store_mark()
    if own.key_check_until is None or not own.fenced:
        return
    now = clock.now()
    if to_text(now) >= own.key_check_until:
        return
    await store.key_check(f"accepted after a rewind: looked up by key before it is sent "
                          f"(until {own.key_check_until})", now)


async def read_rewound(store: DeliveryStore, port: CRMRecordPort, clock: Clock,
                       batch_size: int, backoff: Backoff | None = None) -> Rewound:
    """Step 3: read back every rewound record, by write_id and then by key, and record
    each verdict (see the module).  A failed read ends the pass (its records stay
    rewound: the next cycle reads them again; they are never sent meanwhile)."""
    result = Rewound()
    own = await store.store_mark()
    if own.rewind is None:
        return result
    if port.marks and not own.fenced:
        return result  # the fence is raised at the next start under the lock
    fenced = port.marks and own.fenced
    by_key = callable(getattr(port.adapter, "read_by_keys", None))
    size = port.read_size(batch_size) if port.reads_many else 1
    target_id = await store.pinned_target()
    due_after = backoff or Backoff()
    after = 0
    while rows := await store.rewound_page(after, size):
        works = lead_works(rows)
        after = works[-1].seq
        try:
            found = await port.read_back_many([w.write_id for w in works])
            lacking = [w for w in works if not found.get(w.write_id)]
            keyed = (rows_by_key(await port.read_by_keys(
                [(w.event.tenant_id, w.source_lead_id) for w in lacking]))
                if lacking and by_key else {})
        except Exception as exc:  # noqa: BLE001 - proves nothing: read again next cycle
            kind, words = describe_failure(exc)
            log.warning("readback of %d rewound records failed (%s): %s", len(works),
                        kind, words, extra={"action": "store.rewind_read_failed",
                                            "count": len(works), "reason": kind})
            return result
        await _record(store, port, clock, works, found, keyed, fenced, target_id,
                      due_after, result)
    result.done = await store.rewind_done(clock.now())
    if result.done:
        log.info("rewind done: %d read back, %d confirmed, %d found under another "
                 "write_id, %d to send, %d left uncertain", result.read, result.confirmed,
                 result.adopted, result.requeued, result.uncertain,
                 extra={"action": "store.rewound", "count": result.read})
    return result


async def _record(store: DeliveryStore, port: CRMRecordPort, clock: Clock,
                  works: list[LeadWork], found: dict[str, list[TargetRow]],
                  keyed: dict[tuple[str, str], list[TargetRow]], fenced: bool,
                  target_id: str | None, due_after: Backoff, result: Rewound) -> None:
    confirmed: list[LeadWork] = []
    adopt: list[tuple[LeadWork, str]] = []
    resend: list[LeadWork] = []
    left: list[tuple[LeadWork, str]] = []
    for work in works:
        record = port.map(work.event)
        rows = found.get(work.write_id, [])
        if rows:
            verdict = classify_readback(rows, record, work.write_id)
            if verdict == "match":
                confirmed.append(work)
            else:
                left.append((work, verdict))
            continue
        held = keyed.get((work.event.tenant_id, work.source_lead_id), [])
        if len(held) == 1 and classify_readback(held, record, held[0].write_id) == "match":
            adopt.append((work, held[0].write_id))
        elif held:
            left.append((work, "ambiguous" if len(held) > 1 else "mismatch"))
        elif fenced or port.dedupes:
            resend.append(work)
        else:
            left.append((work, "none"))
    now = clock.now()
    if confirmed or resend:
        # proven not held behind a raised fence: due now (no failure to back off from)
        requeue = Requeue([w.write_id for w in resend], target_id,
                          (lambda _: now) if fenced else
                          (lambda attempts: due_after.next_attempt(attempts, now)),
                          FENCED_REASON if fenced else "resend: the target deduplicates "
                          "by write_id and holds no row", "fence" if fenced else None)
        await store.record_reconcile_batch([(w.write_id, None, None) for w in confirmed],
                                           now, requeue if resend else None)
    if adopt:
        taken = await store.adopt_write_ids([(w.write_id, held) for w, held in adopt], now)
        await store.record_reconcile_batch([(w, None, None) for w in taken], now)
    if left:
        await store.rewound_untag([(w.write_id, verdict) for w, verdict in left], now)
        log.warning("%d rewound records left uncertain (reconcile only, never resent): "
                    "the target holds a row that differs, two rows, or cannot prove none "
                    "was sent", len(left), extra={
                        "action": "batch.still_uncertain", "count": len(left),
                        "keys": [w.source_lead_id for w, _ in left][:10],
                        "reason": left[0][1]})
    result.read += len(works)
    result.confirmed += len(confirmed)
    result.adopted += len(adopt)
    result.requeued += len(resend)
    result.uncertain += len(left)


async def refused(store: DeliveryStore, port: CRMRecordPort, clock: Clock, kind: str) -> None:
    """A batch's mark was refused (it applied nothing, and is failed_safe): a stale one
    means the store is behind (rewind now, under the lock this cycle holds); a foreign one
    that another store owns the target (stop: exit 78)."""
    own = await store.store_mark()
    try:
        held = await port.read_mark()
    except Exception as exc:  # noqa: BLE001 - the next start checks again
        kind_, words = describe_failure(exc)
        raise TargetUnavailable(f"the target refused a batch's mark ({kind}) and its mark "
                                f"cannot be read ({kind_}): {words}") from None
    if kind == "foreign_mark" or (held.owner is not None and held.owner != own.store_id):
        raise _owned(held, own.store_id)
    await fence(store, port, clock, held,
                f"the target refused batch {in_words(own.seq)} as stale: it holds "
                f"{in_words(held.seq)} of this store, which forgot what it sent")
