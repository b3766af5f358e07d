"""Recovery and the reconcile pass (SPEC L6-L8, E7): on taking the worker lock every
in-flight record becomes uncertain, and each cycle reads every uncertain record back
before anything is dispatched.

The recovery policy of an external write is *mark uncertain and reconcile only* (K5): an
exact readback confirms; anything else leaves the record uncertain and visible, and
counts a reconcile attempt.  Never a second send, with one exception that is a property
of the target, not of time: a target that deduplicates by write_id (SPEC E7; declared by
the adapter, proven by the conformance kit) cannot make a second row, so a record whose
fresh readback finds no row there is queued to be sent again, on the backoff schedule,
with a kept authorisation and its outbox event.  No timer, empty readback or restart
authorises a resend on any other target.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from runner import crashpoints
from runner.clock import Clock
from runner.leads.pacing import Backoff
from runner.leads.port import (
    CRMRecordPort,
    classify_readback,
    describe_failure,
    readback_in_words,
)
from runner.storedata import LeadWork, Requeue

if TYPE_CHECKING:
    from runner.store import DeliveryStore

log = logging.getLogger("runner.deliver")


class Stopping(Protocol):
    """What a reconcile pass asks of the runner loop: whether to stop between chunks."""

    @property
    def stopping(self) -> bool: ...


async def recover(store: DeliveryStore, clock: Clock) -> int:
    crashpoints.hit("recover.before-commit")
    keys = await store.recover_in_flight(clock.now())
    crashpoints.hit("recover.after-commit")
    for key in keys:
        log.warning("in flight at start: now uncertain (reconcile only, never resent)",
                    extra={"action": "lead.recovered", "key": key, "to_state": "uncertain"})
    return len(keys)


@dataclass
class Reconciled:
    """What a reconcile pass did: records confirmed by readback, and records queued to be
    sent again on a target that deduplicates by write_id (SPEC E7)."""

    confirmed: int = 0
    requeued: int = 0



#: why a requeued record is sendable again (its ``last_error`` until it is sent)
REQUEUE_REASON = "resend: the target deduplicates by write_id and holds no row"


async def reconcile_all(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, guard: Stopping | None = None,
    batch_size: int = 1, backoff: Backoff | None = None,
) -> Reconciled:
    """Read back every uncertain record once; returns how many were confirmed, and how
    many were queued to be sent again.

    The pass reads its keys first (``reconcile_order``: oldest reconcile attempt first,
    then accept order), then reads the records back ``batch_size`` at a time (at most
    the adapter's ``max_read``: ``CRMRecordPort.read_size``), each chunk in one target
    request (``read_back_many``; paced by the target's quota like every request) whose
    verdicts are recorded in one commit.  An adapter that cannot read many write_ids at
    once is read one record per request.  A stop ends the pass between
    chunks; the next pass starts with the records this one did not reach (they are now
    the oldest).  Every call of the pass has returned when it returns: dispatch starts
    only then (L8).

    On a target that deduplicates by write_id (``port.dedupes``, SPEC E7), a record whose
    readback finds no row is queued to be sent again (:func:`reconcile_chunk`), due on
    ``backoff``'s schedule; on any other target it stays uncertain (L6)."""
    order = await store.reconcile_order()
    # one request per chunk; one per record for an adapter that cannot read many
    size = port.read_size(batch_size) if port.reads_many else 1
    done = Reconciled()
    target_id: str | None = None
    if order and port.dedupes:
        target_id = await store.pinned_target()
    for start in range(0, len(order), size):
        if guard is not None and guard.stopping:
            return done
        chunk = await store.uncertain_by_seqs(order[start : start + size])
        if chunk:
            found = await reconcile_chunk(store, port, clock, chunk, backoff=backoff,
                                          target_id=target_id)
            done.confirmed += found.confirmed
            done.requeued += found.requeued
    return done


async def reconcile_chunk(
    store: DeliveryStore, port: CRMRecordPort, clock: Clock, chunk: list[LeadWork], *,
    backoff: Backoff | None = None, target_id: str | None = None,
) -> Reconciled:
    """Read a chunk of uncertain records back in one request and record every verdict in
    one commit.  Each record's verdict is what ``classify_readback`` makes of its own
    rows; a failed read leaves every record of the chunk uncertain (``read_failed``), as
    it proves nothing either way (L6).

    The one exception to "never resent" (SPEC E7): when the target deduplicates by
    write_id (``port.dedupes``: the adapter declares it, and the conformance kit proves
    it), a record whose fresh readback found *no row* is authorised for one resend in the
    same commit (a kept ``resend_authorizations`` row and its ``resend_authorized``
    event) and becomes ``failed_safe``, due again at ``backoff``'s next attempt: a resend
    cannot make a second row there, and one that finds the row already written is
    confirmed by its readback.  A row that differs, two rows or a failed read leave the
    record uncertain on every target."""
    verdicts: list[str]
    try:
        rows = await port.read_back_many([work.write_id for work in chunk])
        verdicts = [classify_readback(rows.get(work.write_id, []), port.map(work.event),
                                      work.write_id) for work in chunk]
        port.repeats.forget("reconcile.read_failed")
    except Exception as exc:  # noqa: BLE001 - a failed read proves nothing either way (L6)
        verdicts = ["read_failed"] * len(chunk)
        kind, words = describe_failure(exc)
        repeated = port.repeats.admit("reconcile.read_failed")
        if repeated is not None:  # a target that is down: a line a minute, not a cycle
            extra: dict[str, object] = {
                "action": "lead.reconcile_failed", "key": chunk[0].source_lead_id,
                "count": len(chunk), "reason": kind}
            if repeated:
                extra["repeats"] = repeated
            log.warning("readback of %d uncertain failed: %s", len(chunk), words,
                        extra=extra)
    resend = [work for work, verdict in zip(chunk, verdicts, strict=True)
              if verdict == "none"] if port.dedupes else []
    requeue = None
    if resend:
        due_after = backoff or Backoff()
        now = clock.now()
        requeue = Requeue([work.write_id for work in resend], target_id,
                          lambda attempts: due_after.next_attempt(attempts, now),
                          REQUEUE_REASON)
    crashpoints.hit("reconcile.before-commit")
    await store.record_reconcile_batch(
        [(work.write_id, None if verdict == "match" else verdict,
          verdict if verdict in ("ambiguous", "mismatch") else None)
         for work, verdict in zip(chunk, verdicts, strict=True)
         if requeue is None or verdict != "none"], clock.now(), requeue)
    crashpoints.hit("reconcile.after-commit")
    confirmed = [work.source_lead_id for work, v in zip(chunk, verdicts, strict=True)
                 if v == "match"]
    if resend:
        keys = [work.source_lead_id for work in resend]
        if len(keys) == 1:
            log.info("no row in the target, which deduplicates by write_id: sent again",
                     extra={"action": "lead.requeued", "key": keys[0],
                            "from_state": "uncertain", "to_state": "failed_safe"})
        else:
            log.info("%d with no row in the target, which deduplicates by write_id: sent "
                     "again", len(keys), extra={
                         "action": "batch.requeued", "count": len(keys), "keys": keys,
                         "from_state": "uncertain", "to_state": "failed_safe"})
    result = Reconciled(len(confirmed), len(resend))
    if len(chunk) == 1:  # the lines of a single readback
        if confirmed:
            log.info("confirmed by readback", extra={
                "action": "lead.reconciled", "key": chunk[0].source_lead_id,
                "from_state": "uncertain", "to_state": "confirmed"})
        elif not resend and verdicts[0] != "read_failed":
            _still_uncertain(port, verdicts[0], [chunk[0].source_lead_id], "lead")
        return result
    if confirmed:
        log.info("%d confirmed by readback", len(confirmed), extra={
            "action": "batch.reconciled", "count": len(confirmed), "keys": confirmed,
            "from_state": "uncertain", "to_state": "confirmed"})
    by_verdict: dict[str, list[str]] = {}
    for work, verdict in zip(chunk, verdicts, strict=True):
        if verdict != "match" and not (resend and verdict == "none"):
            by_verdict.setdefault(verdict, []).append(work.source_lead_id)
    for verdict, keys in by_verdict.items():  # a line per verdict, not per record
        if verdict != "read_failed":  # said once, above
            _still_uncertain(port, verdict, keys, "batch")
    return result


#: the keys a line about many uncertain records names (``runner uncertain`` lists them all)
KEYS_SHOWN = 10


def _still_uncertain(port: CRMRecordPort, verdict: str, keys: list[str], what: str) -> None:
    """The line for records a readback left uncertain: one per verdict, and at most one a
    minute for the same verdict (a record read back every cycle is not news every cycle;
    the line says how many like it were left out)."""
    repeated = port.repeats.admit(("reconcile", verdict))
    if repeated is None:
        return
    extra: dict[str, object] = {"action": f"{what}.still_uncertain", "reason": verdict}
    if repeated:
        extra["repeats"] = repeated
    if what == "lead":
        extra["key"] = keys[0]
        log.warning("still uncertain: %s", readback_in_words(verdict), extra=extra)
        return
    extra.update(count=len(keys), keys=keys[:KEYS_SHOWN])
    log.warning("%d still uncertain: %s", len(keys), readback_in_words(verdict), extra=extra)
