"""What a dispatch run's sends came to (SPEC L5, L13; issue 29): the cycle's counts
(:class:`CycleSummary`), why an outcome failed (:class:`Failure`, kept with the record as
``last_error`` and ``last_failure``), and how committed outcomes are counted and logged: a
batch's confirmations in one line, its failures in one line per kind, and a failure said
again within a minute left out (``runner.logs.Repeats``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import NamedTuple

from runner.clock import to_text
from runner.ids import WriteId
from runner.leads.failures import FAILURES
from runner.leads.states import LeadState
from runner.logs import Repeats
from runner.storedata import LeadWork

log = logging.getLogger("runner.deliver")


@dataclass
class CycleSummary:
    """What one cycle did (L13): counts of transitions made by this cycle, and of its poll
    pass: ``polled`` records read, ``poll_failed`` of them whose read failed (all of them:
    the pass read nothing).  ``requeued``: uncertain records the reconcile pass queued to
    be sent again, on a target that deduplicates by write_id (SPEC E7).  A send's outcome
    is counted when it is committed, so a send
    that a hard stop records uncertain counts as ``uncertain``.  ``still_uncertain``: how
    many records were uncertain when the cycle ended (None: it could not be read)."""

    recovered: int = 0
    reconciled: int = 0
    requeued: int = 0
    dispatched: int = 0
    confirmed: int = 0
    failed_safe: int = 0
    uncertain: int = 0
    polled: int = 0
    poll_failed: int = 0
    still_uncertain: int | None = None
    #: the kind of a mark refusal that ended the dispatch (``stale_mark``,
    #: ``foreign_mark``; SPEC E8): the store is behind its target, or not its owner; not
    #: part of the summary's JSON
    refused_mark: str | None = field(default=None, compare=False)

    @property
    def moved(self) -> int:
        """How many record transitions the cycle made (the poll pass's aside)."""
        return (self.recovered + self.reconciled + self.requeued + self.dispatched
                + self.confirmed + self.failed_safe + self.uncertain)

    def to_json(self) -> dict[str, int | None]:
        counts: dict[str, int | None] = asdict(self)
        del counts["refused_mark"]
        return counts


class Failure(NamedTuple):
    """Why a send's outcome is failed_safe or uncertain: what happened (``kind``, one of
    ``runner.leads.failures.FAILURES``, kept as ``last_failure``) in an operator's words
    (``reason``, kept as ``last_error``), and, failed safe, when it is due again
    (``at``)."""

    kind: str
    reason: str
    at: datetime | None = None


#: a record marked in flight whose send has not said more: if the run ends here, it is
#: uncertain because the worker stopped
STOPPED = Failure("stopped", FAILURES["stopped"])

#: a sent record, its outcome (uncertain until the send says more) and why it failed (None:
#: confirmed); not committed yet
Pending = tuple[LeadWork, LeadState, Failure | None]


def done_of(pending: list[Pending]) -> list[tuple[WriteId, LeadState]]:
    return [(work.write_id, outcome) for work, outcome, _ in pending]


def retry_of(pending: list[Pending]) -> tuple[datetime | None, str | None, str | None]:
    """The step's retry time, reason and kind of failure: its outcomes are one request's,
    so they share one."""
    at = next((f.at for _, _, f in pending if f is not None and f.at is not None), None)
    first = next((f for _, _, f in pending if f is not None), None)
    return (at, None, None) if first is None else (at, first.reason, first.kind)


def count(summary: CycleSummary, outcome: LeadState) -> None:
    if outcome is LeadState.CONFIRMED:
        summary.confirmed += 1
    elif outcome is LeadState.FAILED_SAFE:
        summary.failed_safe += 1
    else:
        summary.uncertain += 1


def counted(summary: CycleSummary, pending: list[Pending], repeats: Repeats) -> None:
    """Count and log outcomes just committed.  A batch's confirmations are one line (the
    keys listed): a line per record costs more than its commit does.  Its other outcomes
    are one line per outcome and kind of failure (a failed batch of 1,000: one line, with
    its size and why), and a failure said again within a minute is left out, counted in
    the next line that says it (``repeats``), so a target that is down does not write a
    warning per cycle."""
    for _, outcome, _ in pending:
        count(summary, outcome)
    if len(pending) == 1:
        log_outcome(pending[0], repeats)
        return
    confirmed = [work.source_lead_id for work, outcome, _ in pending
                 if outcome is LeadState.CONFIRMED]
    if confirmed:
        log.info("%d confirmed", len(confirmed), extra={
            "action": "batch.confirmed", "count": len(confirmed), "keys": confirmed,
            "from_state": "in_flight", "to_state": "confirmed"})
    failed: dict[tuple[LeadState, str], list[Pending]] = {}
    for item in pending:
        if item[1] is not LeadState.CONFIRMED and item[2] is not None:
            failed.setdefault((item[1], item[2].kind), []).append(item)
    for (outcome, kind), items in failed.items():
        repeated = repeats.admit((outcome, kind))
        if repeated is None:
            continue
        failure = items[0][2]
        assert failure is not None
        extra: dict[str, object] = {
            "action": f"batch.{outcome.value}", "count": len(items),
            "keys": [work.source_lead_id for work, _, _ in items[:KEYS_SHOWN]],
            "from_state": "in_flight", "to_state": outcome.value, "reason": kind}
        if repeated:
            extra["repeats"] = repeated
        if failure.at is not None:
            extra["next_attempt_at"] = to_text(failure.at)
            log.warning("%d %s: %s; next attempt at %s", len(items), outcome.value,
                        failure.reason, extra["next_attempt_at"], extra=extra)
        else:
            log.warning("%d %s: %s", len(items), outcome.value, failure.reason, extra=extra)


#: the keys a line about many failed records names (the first ones; ``runner uncertain``
#: and ``status --records`` list them all)
KEYS_SHOWN = 10


def log_outcome(item: Pending, repeats: Repeats) -> None:
    work, outcome, failure = item
    extra: dict[str, object] = {"action": f"lead.{outcome.value}", "key": work.source_lead_id,
                                "from_state": "in_flight", "to_state": outcome.value}
    if failure is None:
        log.info("%s", outcome.value, extra=extra)
        return
    repeated = repeats.admit((outcome, failure.kind))
    if repeated is None:
        return
    extra["reason"] = failure.kind
    if repeated:
        extra["repeats"] = repeated
    if failure.at is None:
        log.warning("%s: %s", outcome.value, failure.reason, extra=extra)
        return
    extra["next_attempt_at"] = to_text(failure.at)
    log.warning("%s: %s; next attempt at %s", outcome.value, failure.reason,
                extra["next_attempt_at"], extra=extra)
