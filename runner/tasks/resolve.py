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

Many records at once (``resolve_all``, issue 29): a crash between a batch's in-flight
commit and its request leaves the whole batch uncertain with no row in the target, and one
command per record does not scale to a batch of 1,000.  ``resolve_all`` pages through the
uncertain records in accept order, reads each chunk back in one request (at most the
adapter's ``max_batch``), exactly as the single resolve reads one record (the store's own,
pinned target, re-checked for every chunk), and decides only the records whose readback is
conclusive for the decision:

* ``not-sent``: no row.  Any row (equal, different, doubled) or a failed read: left alone.
* ``confirmed``: exactly one row equal to the record (``match``).  It is recorded as the
  operator's confirmed decision *with that readback* (``readback: "match"``), not as a
  reconcile: the operator asked for it, with a reason, and the audit keeps both who asked
  and what proved it; a ``confirmed`` decision without a readback stays what it was, the
  operator's word that the row was verified by other means.  No row, a row that differs,
  two rows or a failed read: left alone.

Each chunk's decisions commit in one transaction (``record_operator_decisions``: one
decision row and its ``operator_resolved`` event per record, then the records' moves, the
schema's guard checking each); a record that is not uncertain at the attempts it was read
back at is left alone.  The holder of the worker lock first makes every in-flight record
uncertain (L7), so a crashed batch is settled by one command.  A stop (``guard``) ends it
between chunks: a readback in progress is abandoned (its chunk stays uncertain), a commit in
progress finishes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio

from runner import crashpoints
from runner.clock import Clock
from runner.errors import BadInputError, RuleViolation
from runner.ids import WriteId
from runner.jsonio import storable_text
from runner.leads.port import CRMRecordPort, classify_readback, readback_in_words
from runner.leads.states import IllegalTransition, LeadState
from runner.store import Decision, DecisionBatch, OperatorStore, ResolveSubject, TargetPins
from runner.tasks.target import ReadCheck, check_for_reads

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


def _check_refusal(check: ReadCheck, **detail: Any) -> RuleViolation | None:
    """The refusal a target check before a fresh readback calls for (None: read on)."""
    if check.failure is not None:
        return RuleViolation(f"the target cannot be read ({check.failure}), so runner cannot "
                             "check what it holds; nothing was changed",
                             reason="target_unreadable", detail=detail)
    if not check.trusted:
        return RuleViolation("the store has no pinned target yet, so runner cannot tell "
                             "that this target is the one the records were sent to (a "
                             "delivery run pins it); nothing was changed",
                             reason="target_not_pinned", detail=detail)
    return None


async def fresh_readback(store: ResolveStore, port: CRMRecordPort, subject: ResolveSubject) -> str:
    """One more exact readback from the store's own target; returns ``none`` or refuses."""
    write_id = subject.work.write_id
    refusal = _check_refusal(await check_for_reads(store, port), write_id=write_id,
                             readback=None)
    if refusal is not None:
        raise refusal
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


# -- many records at once: resolve --all (issue 29) -----------------------------------

#: the most records a ``resolve --all`` answer lists among those it left alone (all of
#: them: ``runner uncertain``)
LISTED = 100
#: why ``resolve --all`` left a record alone (``left_by_reason``, every key always there)
LEFT_REASONS = ("row_present", "no_row", "row_differs", "two_rows", "read_failed",
                "not_uncertain")
_CONFIRMED_LEFT = {"none": "no_row", "mismatch": "row_differs", "ambiguous": "two_rows"}


def judge(resolve_as: ResolveAs, verdict: str) -> str | None:
    """Whether a fresh readback ``verdict`` (``classify_readback``'s, or ``read_failed``)
    is conclusive for the decision: None if it is, else why the record is left alone.
    ``not-sent`` needs no row; ``confirmed`` exactly one row equal to the record."""
    if verdict == "read_failed":
        return "read_failed"
    if resolve_as == "not-sent":
        return None if verdict == "none" else "row_present"
    return None if verdict == "match" else _CONFIRMED_LEFT[verdict]


class StopGuard(Protocol):
    """How a stop reaches ``resolve_all`` (``runner.signals.Shutdown`` is one)."""

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for: no new chunk starts."""
        ...

    def work(self) -> AbstractContextManager[anyio.CancelScope]:
        """The scope of a chunk's readback: a stop cancels it at once."""
        ...

    def shield(self) -> AbstractContextManager[anyio.CancelScope]:
        """The scope of a chunk's commit: shielded from a graceful stop."""
        ...


class NoStop:
    """For a call without signals: never stopping."""

    stopping = False

    @contextmanager
    def work(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            yield scope

    shield = work


@dataclass
class ResolveAllResult:
    """What ``resolve_all`` did, filled as it goes (a hard stop still reports what was
    committed)."""

    resolve_as: ResolveAs
    dry_run: bool
    #: in_flight records made uncertain first (a dry run: that recovery would make so)
    recovered: int = 0
    examined: int = 0
    decided: int = 0
    left_by_reason: Counter[str] = field(default_factory=Counter)
    #: the first ``LISTED`` records left alone: write_id, source_lead_id, why, readback
    listed: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    stopped: bool = False
    still_uncertain: int | None = None

    @property
    def left(self) -> int:
        return sum(self.left_by_reason.values())

    def leave(self, subject: ResolveSubject, why: str, verdict: str) -> None:
        self.left_by_reason[why] += 1
        if len(self.listed) < LISTED:
            self.listed.append({"write_id": subject.work.write_id,
                                "source_lead_id": subject.work.source_lead_id,
                                "why": why, "readback": verdict})

    def to_json(self) -> dict[str, Any]:
        to_state = LeadState.CONFIRMED if self.resolve_as == "confirmed" else \
            LeadState.FAILED_SAFE
        return {"result": "would_resolve" if self.dry_run else "resolved",
                "as": self.resolve_as, "to_state": to_state.value,
                "recovered": self.recovered, "examined": self.examined,
                "decided": self.decided, "left": self.left,
                "left_by_reason": {why: self.left_by_reason[why] for why in LEFT_REASONS},
                "left_records": self.listed, "left_truncated": self.left > len(self.listed),
                "chunks": self.chunks, "stopped": self.stopped,
                "still_uncertain": self.still_uncertain}


async def read_chunk(store: ResolveStore, port: CRMRecordPort, chunk: Sequence[ResolveSubject],
                     *, check: bool = True) -> tuple[list[str], str | None]:
    """A chunk's fresh readback verdicts (``classify_readback``'s, ``read_failed`` for a
    read that failed) and the failure, if any: one request for the chunk when the adapter
    reads many write_ids at once (a failed request fails the chunk), else one request per
    record (a failed read fails its record).  ``check``: first check that the target is
    the store's own (``check_for_reads``); one that is not fails the chunk."""
    if check:
        found = await check_for_reads(store, port)
        if _check_refusal(found) is not None:
            return ["read_failed"] * len(chunk), found.failure or "target_not_pinned"
    if port.reads_many:
        try:
            rows = await port.read_back_many([s.work.write_id for s in chunk])
        except Exception as exc:  # noqa: BLE001 - a failed read proves nothing either way
            return ["read_failed"] * len(chunk), type(exc).__name__
        return [classify_readback(rows.get(s.work.write_id, []), port.map(s.work.event),
                                  s.work.write_id) for s in chunk], None
    verdicts: list[str] = []
    failure: str | None = None
    for s in chunk:
        try:
            verdicts.append(await port.confirm(s.work.event, s.work.write_id))
        except Exception as exc:  # noqa: BLE001 - a failed read proves nothing either way
            verdicts.append("read_failed")
            failure = type(exc).__name__
    return verdicts, failure


async def resolve_all(
    store: ResolveStore,
    port: CRMRecordPort,
    clock: Clock,
    resolve_as: ResolveAs,
    reason: str,
    *,
    chunk_size: int,
    dry_run: bool = False,
    guard: StopGuard | None = None,
    result: ResolveAllResult | None = None,
) -> ResolveAllResult:
    """Decide every uncertain record whose fresh readback is conclusive for ``resolve_as``
    (see the module docstring), ``chunk_size`` records per readback request (at most the
    adapter's ``max_batch``) and per commit.  The caller holds the worker lock.  A target
    that cannot be read, or is not the store's pinned one, refuses the whole call before
    anything changes (``target_unreadable``, ``target_not_pinned``: exit 65); a store
    with nothing uncertain or in flight answers zero counts without reading the target.
    ``result`` is filled as the call goes."""
    reason = check_reason(reason)
    guard = guard or NoStop()
    result = result if result is not None else ResolveAllResult(resolve_as, dry_run)
    size = port.batch_size(chunk_size)
    decision: Literal["confirmed", "not_sent"] = (
        "confirmed" if resolve_as == "confirmed" else "not_sent")
    conclusive = "match" if resolve_as == "confirmed" else "none"
    if await store.resolve_page(0, 1, in_flight=True):
        refusal = _check_refusal(await check_for_reads(store, port), **{"as": resolve_as})
        if refusal is not None:
            raise refusal
        if not dry_run:
            result.recovered = len(await store.recover_in_flight(clock.now()))
            if result.recovered:
                log.warning("%d in flight: now uncertain (their worker is gone)",
                            result.recovered, extra={"action": "resolve.recovered",
                                                     "count": result.recovered})
    else:
        log.info("no uncertain records: nothing to resolve", extra={"action": "resolve.none"})
    after = 0
    while not guard.stopping:
        page = await store.resolve_page(after, size, in_flight=dry_run)
        if not page or guard.stopping:
            break
        after = page[-1].work.seq
        read: tuple[list[str], str | None] | None = None
        with guard.work():
            read = await read_chunk(store, port, page, check=result.chunks > 0)
        if read is None:  # a stop abandoned the readback: the chunk stays as it is
            break
        verdicts, failure = read
        result.chunks += 1
        result.examined += len(page)
        if dry_run:
            result.recovered += sum(s.work.state is LeadState.IN_FLIGHT for s in page)
        ready = [s for s, v in zip(page, verdicts, strict=True) if judge(resolve_as, v) is None]
        decided = {s.work.write_id for s in ready}
        if ready and not dry_run:
            batch = DecisionBatch(decision, reason, conclusive,
                                  tuple((s.work.write_id, s.attempts) for s in ready))
            crashpoints.hit("resolve.before-commit")
            with guard.shield():
                decided = await store.record_operator_decisions(batch, clock.now())
            crashpoints.hit("resolve.after-commit")
        left_before = result.left
        for subject, verdict in zip(page, verdicts, strict=True):
            why = judge(resolve_as, verdict)
            if why is None and subject.work.write_id not in decided:
                why = "not_uncertain"
            if why is None:
                result.decided += 1
            else:
                result.leave(subject, why, verdict)
        _log_chunk(result, len(decided), result.left - left_before, failure)
    result.stopped = guard.stopping
    result.still_uncertain = await store.uncertain_count()
    if result.left:
        log.warning("%d record(s) left uncertain (listed: %d); 'runner uncertain' lists "
                    "every uncertain record", result.left, len(result.listed),
                    extra={"action": "resolve.left", "count": result.left})
    return result


def _log_chunk(result: ResolveAllResult, decided: int, left: int, failure: str | None) -> None:
    """One line per chunk, never one per record."""
    verb = "would resolve" if result.dry_run else "resolved"
    extra: dict[str, Any] = {
        "action": "batch.would_resolve" if result.dry_run else "batch.resolved",
        "chunk": result.chunks, "count": decided, "left": left, "as": result.resolve_as}
    if failure is not None:
        extra["reason"] = failure
    log.info("chunk %d: %s %d as %s, %d left uncertain%s", result.chunks, verb, decided,
             result.resolve_as, left, f" (readback failed: {failure})" if failure else "",
             extra=extra)
