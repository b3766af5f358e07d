"""The ``status`` document (SPEC L13), built from one consistent read of the store.

The record list is streamed: a store with 100,000 records is written out page by page,
never held in memory as a whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.candidates.results import SCHEDULE, CandidateSummary
from runner.storedata import LeadRow, StoreSummary

if TYPE_CHECKING:
    from runner.store import Store


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
        # failed_safe by a rejected write (HTTP 400/422): the target's reason (issue 17)
        "last_error": row.last_error,
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


def _inner(doc: dict[str, Any]) -> str:
    return _dumps(doc)[1:-1]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def pipeline_blocks(store: Store) -> dict[str, Any]:
    """Staged processing (SPEC P3, P10, P11): the ``pipeline`` block (backlog per stage
    and processor version, level sizes, the raw retriever's desired and effective
    configuration) and the lead ``funnel`` (``{form_id: {status: count}}``)."""
    from runner.pipeline.report import builtin_refs, pipeline_document

    return {"pipeline": await pipeline_document(store, builtin_refs()),
            "funnel": await store.funnel()}


async def write_status(store: Store, write: Callable[[str], object]) -> None:
    """Write the status document as one JSON line, streaming the records."""
    async with store.reading():
        summary = await store.summary()
        lifecycle = await store.candidate_summary()
        pipeline = await pipeline_blocks(store)
        write("{" + _inner(head_json(summary)) + ',"records":[')
        first = True
        async for row in store.iter_records():
            write(("" if first else ",") + _dumps(record_json(row)))
            first = False
        write("]," + _inner(tail_json(summary)) + ',"lifecycle":'
              + _dumps(lifecycle_json(lifecycle)) + "," + _inner(pipeline)
              + ',"decisions":' + _dumps(summary.decisions) + "}\n")


async def status_document(store: Store) -> dict[str, Any]:
    """The whole status document in memory (the library call; the CLI streams)."""
    async with store.reading():
        summary = await store.summary()
        lifecycle = await store.candidate_summary()
        records = [record_json(row) async for row in store.iter_records()]
        pipeline = await pipeline_blocks(store)
    return {**head_json(summary), "records": records, **tail_json(summary),
            "lifecycle": lifecycle_json(lifecycle), **pipeline,
            "decisions": summary.decisions}
