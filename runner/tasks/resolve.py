"""Operators resolve uncertain records, on the record (SPEC E5, L4; ARCHITECTURE idea 9).

An uncertain record is never resent by runner on its own (K5: *mark uncertain and
reconcile only*).  Only two things ever make a record sendable again: a typed "nothing was
sent" error, and an operator's recorded decision after a fresh readback.  This module is
the second one:

* ``confirmed``: the operator verified the row by other means.  The record becomes
  confirmed (polled from then on); no readback is needed, and none is made.
* ``not-sent``: the operator says the original request can no longer arrive.  runner
  first reads the target back once more, exactly as reconcile does, from the store's own
  (pinned) target; only a readback that finds *no row* lets the decision through, and the
  record becomes ``failed_safe``, which the next cycle sends.  A row that is there (equal,
  different or doubled), a target that cannot be read or is not the pinned one: refused,
  nothing changed.

Each decision commits in one transaction with the record's move and an
``operator_resolved`` outbox event carrying the operator's reason; the schema refuses
``uncertain -> failed_safe`` unless that decision row exists for the record's current
``attempts``.  Only uncertain records can be resolved.

The caller holds the worker lock for the whole call (readback and commit), so no
worker's reconcile or dispatch can run between them; every transition is also guarded by
the record's state and attempts in the store.  ``dry_run`` makes the same checks (and the
readback) and writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from runner.clock import Clock
from runner.errors import BadInputError, RuleViolation
from runner.ids import WriteId
from runner.jsonio import storable_text
from runner.leads.port import CRMRecordPort, readback_in_words
from runner.leads.states import IllegalTransition, LeadState
from runner.store import Decision, OperatorStore, ResolveSubject, TargetPins
from runner.tasks.target import check_for_reads

log = logging.getLogger("runner.resolve")


class ResolveStore(OperatorStore, TargetPins, Protocol):
    """What resolving needs: the operator's operations and the pinned target."""

ResolveAs = Literal["confirmed", "not-sent"]
RESOLVE_AS: tuple[ResolveAs, ...] = ("confirmed", "not-sent")
#: the longest reason kept (characters)
MAX_REASON = 1000


def check_reason(text: str) -> str:
    """The operator's reason, stripped: non-empty, at most ``MAX_REASON`` characters, and
    storable by both backends (no NUL, no lone surrogate)."""
    reason = text.strip()
    if not reason:
        raise BadInputError("--reason must say why (it is kept with the decision)",
                            reason="invalid_reason")
    if len(reason) > MAX_REASON:
        raise BadInputError(f"--reason is longer than {MAX_REASON} characters",
                            reason="invalid_reason")
    if not storable_text(reason):
        raise BadInputError("--reason must not hold a NUL character or a lone surrogate",
                            reason="invalid_reason")
    return reason


@dataclass(frozen=True)
class ResolveResult:
    decision: Decision
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {"result": "would_resolve" if self.dry_run else "resolved",
                "write_id": d.write_id, "source_lead_id": d.source_lead_id,
                "as": "confirmed" if d.decision == "confirmed" else "not-sent",
                "from_state": LeadState.UNCERTAIN.value, "to_state": d.to_state.value,
                "readback": d.readback, "attempts": d.attempts}


def _refused(message: str, reason: str, write_id: str, **detail: Any) -> RuleViolation:
    return RuleViolation(f"{message}; nothing was changed", reason=reason,
                         detail={"write_id": write_id, **detail})


async def fresh_readback(store: ResolveStore, port: CRMRecordPort, subject: ResolveSubject) -> str:
    """One more exact readback from the store's own target; returns ``none`` or refuses."""
    write_id = subject.work.write_id
    check = await check_for_reads(store, port)
    if check.failure is not None:
        raise _refused(f"the target cannot be read ({check.failure}), so runner cannot "
                       "check that no row is there", "target_unreadable", write_id,
                       readback=None)
    if not check.trusted:
        raise _refused("the store has no pinned target yet, so runner cannot tell that "
                       "this target is the one the record was sent to (a delivery run "
                       "pins it)", "target_not_pinned", write_id, readback=None)
    try:
        verdict: str = await port.confirm(subject.work.event, write_id)
    except Exception as exc:  # noqa: BLE001 - a failed read proves nothing: refuse
        raise _refused(f"the readback failed ({type(exc).__name__}), so runner cannot check "
                       "that no row is there", "target_unreadable", write_id,
                       readback="read_failed") from None
    if verdict != "none":
        hint = (" (the next cycle confirms it by readback)" if verdict == "match" else "")
        raise _refused(f"the target holds a row for this write_id: "
                       f"{readback_in_words(verdict)}{hint}", "row_present", write_id,
                       readback=verdict)
    return verdict


async def resolve(
    store: ResolveStore,
    port: CRMRecordPort | None,
    clock: Clock,
    write_id: str,
    resolve_as: ResolveAs,
    reason: str,
    *,
    dry_run: bool = False,
) -> ResolveResult:
    """Record an operator's decision on one uncertain record (see the module docstring).
    The caller holds the worker lock.  Refusals are ``RuleViolation`` (exit 65) with a
    stable reason: ``unknown_record``, ``not_uncertain``, ``row_present``,
    ``target_unreadable``, ``target_not_pinned``; nothing is changed then."""
    reason = check_reason(reason)
    subject = await store.resolve_subject(WriteId(write_id))
    if subject is None:
        raise _refused("no record has this write_id", "unknown_record", write_id)
    state = subject.work.state
    if state is not LeadState.UNCERTAIN:
        raise _refused(f"only uncertain records can be resolved; this one is {state.value}",
                       "not_uncertain", write_id, state=state.value)
    readback: str | None = None
    if resolve_as == "not-sent":
        if port is None:
            raise RuleViolation("--as not-sent needs --target: runner reads the target back "
                                "before it lets a record be sent again",
                                reason="target_required", detail={"write_id": write_id})
        readback = await fresh_readback(store, port, subject)
    decision = Decision(
        tenant_id=subject.tenant_id, source_lead_id=subject.work.source_lead_id,
        write_id=subject.work.write_id,
        decision="confirmed" if resolve_as == "confirmed" else "not_sent",
        reason=reason, readback=readback, attempts=subject.attempts)
    if dry_run:
        return ResolveResult(decision, dry_run=True)
    try:
        await store.record_operator_decision(decision, clock.now())
    except IllegalTransition:
        raise _refused("the record changed while it was being resolved", "not_uncertain",
                       write_id) from None
    log.info("resolved by an operator: %s -> %s", LeadState.UNCERTAIN.value,
                decision.to_state.value,
                extra={"action": "lead.resolved", "key": decision.source_lead_id,
                       "from_state": LeadState.UNCERTAIN.value,
                       "to_state": decision.to_state.value, "attempts": decision.attempts})
    return ResolveResult(decision, dry_run=False)
