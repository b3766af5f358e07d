"""The ``status`` document (SPEC L13), built from one consistent read of the store.

Why it stays small (issue 21): the document is the store's health at a glance, so its
size must not grow with the store.  It carries the counts (per state, per outbox kind:
kept by triggers, never counted row by row), the retries, poll health, decisions, the
pipeline blocks, and the oldest uncertain records only, at most ``UNCERTAIN_SHOWN`` of
them, with their total and a ``truncated`` flag.  A million leads answer in a few small
reads.  The full record list is an explicit request (``runner status --records``,
``DurableWorker.records()``): NDJSON, one record per line, read page by page by index,
so its memory stays the same whatever the store's size.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from runner.candidates.results import SCHEDULE, CandidateSummary
from runner.errors import UsageError
from runner.leads.states import LeadState
from runner.limits import MAX_SHOWN, UNCERTAIN_SHOWN
from runner.storedata import LeadRow, StoreSummary

if TYPE_CHECKING:
    from runner.store import StatusReader, Store


def record_json(row: LeadRow) -> dict[str, Any]:
    return {
        "source_lead_id": row.source_lead_id,
        "state": row.state.value,
        "write_id": row.write_id,
        "attempts": row.attempts,
        "reconcile_attempts": row.reconcile_attempts,
        "snapshot": row.snapshot,
        "last_polled_at": row.last_polled_at,
        "contact_alias_present": row.contact_alias_present,
        # failed_safe or uncertain: why, in words and its kind (issues 17, 29)
        "last_error": row.last_error,
        "last_failure": row.last_failure,
    }


def head_json(summary: StoreSummary) -> dict[str, Any]:
    return {
        "scope": summary.scope,
        "schema_version": summary.schema_version,
        "counts": {state.value: n for state, n in summary.counts.items()},
        # the failed_safe records waiting for their backoff, the earliest next attempt
        # among them (issue 16), and how many the target rejected, with a reason
        # (``last_error`` on each record; issue 17)
        "retries": summary.retries,
    }


def tail_json(summary: StoreSummary) -> dict[str, Any]:
    """``retries``: the failed_safe records waiting for their backoff and the earliest
    next attempt among them (issue 16).  ``outbox.count`` and ``outbox.by_kind`` count the
    events in the store; after a prune (``runner outbox prune``) ``outbox.pruned`` counts
    those removed (kept + pruned = every event ever written) and ``last_seq`` stays the
    last sequence handed out."""
    outbox: dict[str, Any] = {
        "count": summary.outbox_count,
        "last_seq": summary.outbox_last_seq,
        "by_kind": summary.outbox_by_kind,
    }
    if summary.outbox_pruned is not None:
        outbox["pruned"] = summary.outbox_pruned
    return {"outbox": outbox, "poll_health": summary.poll_health}


def lifecycle_json(summary: CandidateSummary) -> dict[str, Any]:
    """The candidate lifecycle (SPEC C5): counts per status, the declared schedule and
    the last sweep any process ran (``null`` before the first)."""
    last = summary.last_sweep
    return {
        "counts": {status.value: n for status, n in summary.counts.items()},
        "schedule": SCHEDULE.to_json(),
        "last_sweep": last.to_json() if last else None,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def pipeline_blocks(store: Store) -> dict[str, Any]:
    """Staged processing (SPEC P3, P10, P11): the ``pipeline`` block (backlog per stage
    and processor version, level sizes, the raw retriever's desired and effective
    configuration) and the lead ``funnel`` (``{form_id: {status: count}}``)."""
    from runner.pipeline.report import builtin_refs, pipeline_document

    return {"pipeline": await pipeline_document(store, builtin_refs()),
            "funnel": await store.funnel()}


def uncertain_json(total: int, rows: list[LeadRow]) -> dict[str, Any]:
    """The ``uncertain`` block: how many records are uncertain (``total``), the oldest
    of them in accept order (``records``, at most the ``shown`` asked for), and whether
    there are more than those (``truncated``)."""
    return {"total": total, "truncated": total > len(rows),
            "records": [record_json(row) for row in rows]}


def check_shown(shown: int) -> None:
    if isinstance(shown, bool) or not isinstance(shown, int) or not 0 <= shown <= MAX_SHOWN:
        raise UsageError(f"shown must be a whole number between 0 and {MAX_SHOWN}, "
                         f"got {shown!r}")


async def _oldest_uncertain(store: StatusReader, shown: int) -> list[LeadRow]:
    rows: list[LeadRow] = []
    if shown == 0:
        return rows
    async with aclosing(store.iter_records(state=LeadState.UNCERTAIN, page=shown)) as page:
        async for row in page:
            rows.append(row)
            if len(rows) == shown:
                break
    return rows


async def marks_json(store: Store, schema_version: int) -> dict[str, Any] | None:
    """The ``marks`` block (SPEC E8, v18): the store's identity, the mark of its last
    batch to a target that keeps marks (``epoch.counter``), a rewind still pending
    (``rewind``: why) and a target's owner adopted but not yet fenced (``adopting``);
    None for a store older than v18 (read as it is: status upgrades nothing)."""
    if schema_version < 18:
        return None
    mark = await store.store_mark()
    return {"store_id": mark.store_id, "mark": f"{mark.epoch}.{mark.counter}",
            "rewind": mark.rewind, "adopting": mark.adopting}


async def status_document(store: Store, *, shown: int = UNCERTAIN_SHOWN) -> dict[str, Any]:
    """The status document: counts, health, the replication guarantee the store runs
    under (``runner.replication``), and the oldest ``shown`` uncertain records (bounded:
    its size does not grow with the store)."""
    check_shown(shown)
    async with store.reading():
        summary = await store.summary()
        lifecycle = await store.candidate_summary()
        oldest = await _oldest_uncertain(store, shown)
        pipeline = await pipeline_blocks(store)
        marks = await marks_json(store, summary.schema_version)
    replication = await store.replication()  # the server's settings now, not the snapshot's
    total = summary.counts.get(LeadState.UNCERTAIN, 0)
    return {**head_json(summary), "replication": replication.to_json(), "marks": marks,
            "uncertain": uncertain_json(total, oldest),
            **tail_json(summary), "lifecycle": lifecycle_json(lifecycle), **pipeline,
            "decisions": summary.decisions}


async def write_status(store: Store, write: Callable[[str], object], *,
                       shown: int = UNCERTAIN_SHOWN) -> None:
    """Write the status document as one JSON line."""
    write(_dumps(await status_document(store, shown=shown)) + "\n")


def record_state(value: LeadState | str | None) -> LeadState | None:
    """A state to list the records of (``None`` or ``"all"``: every record); a name that
    is no state is a ``UsageError`` naming the states."""
    if value is None or isinstance(value, LeadState):
        return value
    if value == "all":
        return None
    try:
        return LeadState(value)
    except ValueError:
        names = ", ".join(state.value for state in LeadState)
        raise UsageError(f"{value!r} is not a record state; use all or one of: {names}"
                         ) from None


async def iter_record_json(store: StatusReader, *, state: LeadState | None = None
                           ) -> AsyncGenerator[dict[str, Any], None]:
    """Every record (or those in ``state``) in accept order, as the documents
    ``write_records`` prints, from one consistent read, page by page."""
    async with store.reading():
        async for row in store.iter_records(state=state):
            yield record_json(row)


async def write_records(store: StatusReader, write: Callable[[str], object], *,
                        state: LeadState | None = None) -> int:
    """Write every record (or those in ``state``) as NDJSON, one record per line, in
    accept order, from one consistent read; returns how many."""
    n = 0
    async with store.reading():
        async for row in store.iter_records(state=state):
            write(_dumps(record_json(row)) + "\n")
            n += 1
    return n
