"""Status observations (SPEC L11, L12): ``observe`` one record, or a bounded fair poll pass.

Observations are latest snapshots, not history, not identity, not a sale.  A failed or
ambiguous read keeps the last snapshot and never means deletion; only an explicit
``missing`` answer makes a confirmed record ``confirmed_then_missing``, which is never
dispatched or recreated.  A run of the same read failure is one ``poll_health`` event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from runner import crashpoints
from runner.clock import Clock
from runner.errors import BadInputError
from runner.ids import WriteId
from runner.jsonio import canonical, storable
from runner.leads.port import CRMRecordPort, Missing, Observation, ReadFailure, Snapshot
from runner.limits import DEFAULT_POLL_LIMIT, POLL_LIMIT_RANGE
from runner.storedata import ObservationWrite
from runner.tasks.target import ReadCheck, check_for_reads

if TYPE_CHECKING:
    from runner.store import PollStore

log = logging.getLogger("runner.poll")

__all__ = ["DEFAULT_POLL_LIMIT", "POLL_LIMIT_RANGE", "PollSummary", "decide", "poll_pass",
           "snapshot_from_json"]


@dataclass
class PollSummary:
    polled: int = 0
    changed: int = 0
    unchanged: int = 0
    missing: int = 0
    failed: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def snapshot_from_json(doc: Mapping[str, Any]) -> Snapshot | Missing:
    """A snapshot document (L11): ``{"missing": true}`` exactly is an explicit missing
    observation; any other object without a ``missing`` key is a business snapshot."""
    if "missing" in doc:
        if dict(doc) == {"missing": True}:
            return Missing()
        raise BadInputError('a snapshot with "missing" must be exactly {"missing": true}',
                            reason="invalid_snapshot")
    if not storable(doc):
        raise BadInputError("a snapshot must not hold a NUL character (U+0000) or a lone surrogate",
                            reason="invalid_snapshot")
    return Snapshot(dict(doc))


#: what a read whose snapshot no store can keep counts as (L12: a failed read)
UNSTORABLE = ReadFailure("unstorable_status: the target's status holds text no store keeps")


def storable_observation(seen: Observation) -> Observation:
    """A snapshot from the target that no store can keep (a NUL character, a lone
    surrogate) is a failed read: it keeps the last snapshot and counts in poll health,
    instead of failing the store write and with it the whole pass."""
    if isinstance(seen, Snapshot) and not storable(seen.data):
        return UNSTORABLE
    return seen


def decide(write_id: WriteId, stored: str | None, seen: Observation) -> ObservationWrite:
    """Pure: what one observation means against the stored snapshot."""
    if isinstance(seen, Missing):
        return ObservationWrite(write_id, "missing")
    if isinstance(seen, ReadFailure):
        return ObservationWrite(write_id, "failed")
    text = canonical(dict(seen.data))
    if text == stored:
        return ObservationWrite(write_id, "unchanged")
    return ObservationWrite(write_id, "changed", text)


def failure_kind(seen: ReadFailure) -> str:
    """A stable name for a failure, so a run of the same failure is recognised."""
    return seen.reason.split(":", 1)[0].strip() or "read_failed"


def _untrusted(seen: Observation) -> Observation:
    """A missing from a target not pinned yet is not believed (L9): a failed read."""
    return ReadFailure("target_not_pinned") if isinstance(seen, Missing) else seen


async def _observe(port: CRMRecordPort, write_ids: list[str]) -> dict[str, Observation]:
    """The status of each write_id, read in requests of at most the adapter's
    ``max_read`` (``CRMRecordPort.status_size``).  The first request that fails ends the
    reading: its write_ids and those not read yet are failed reads, which keep their last
    snapshots (L12); what the requests before it read is kept."""
    size = port.status_size(len(write_ids))
    seen: dict[str, Observation] = {}
    for start in range(0, len(write_ids), size):
        try:
            seen.update(await port.observe_status(write_ids[start : start + size]))
        except Exception as exc:  # noqa: BLE001 - a failed read keeps every snapshot (L12)
            failure = ReadFailure(f"read_error:{type(exc).__name__}")
            seen.update((w, failure) for w in write_ids[start:])
            break
    return seen


async def poll_pass(store: PollStore, port: CRMRecordPort, clock: Clock, limit: int,
                    check: ReadCheck | None = None) -> PollSummary:
    """Read the status of at most ``limit`` confirmed records, oldest poll first (in
    requests of at most the adapter's ``max_read``), and record them in one commit.

    ``check``: what the caller already knows of the target (``TRUSTED`` after the checks
    before work); else the target is checked here (``runner.tasks.target``): an absent,
    unreadable, foreign or unpinned-other target fails every read of the pass."""
    summary = PollSummary()
    due = await store.poll_page(limit)
    if not due:
        return summary
    if check is None:
        check = await check_for_reads(store, port)
    seen: dict[str, Observation]
    if check.failure is not None:
        seen = {t.write_id: ReadFailure(check.failure) for t in due}
    else:
        seen = await _observe(port, [t.write_id for t in due])
        if not check.trusted:
            seen = {w: _untrusted(o) for w, o in seen.items()}
        seen = {w: storable_observation(o) for w, o in seen.items()}
    writes = [decide(t.write_id, t.snapshot, seen[t.write_id]) for t in due]
    failures = sorted({failure_kind(o) for o in seen.values() if isinstance(o, ReadFailure)})
    crashpoints.hit("poll.before-apply")
    _, new_failure = await store.record_poll_pass(writes, ",".join(failures) or None,
                                                  clock.now())
    crashpoints.hit("poll.after-apply")
    if new_failure:
        log.warning("status reads failing: %s", ",".join(failures),
                    extra={"action": "poll.health", "reason": ",".join(failures)})
    keys = {t.write_id: t.source_lead_id for t in due}
    for write in writes:
        setattr(summary, write.outcome, getattr(summary, write.outcome) + 1)
        if write.outcome in ("changed", "missing"):
            log.info("status %s", write.outcome, extra={
                "action": f"lead.status_{write.outcome}", "key": keys[write.write_id]})
    summary.polled = len(due)
    return summary
