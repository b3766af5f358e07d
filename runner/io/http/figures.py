"""The store's figures as Prometheus metric families, read at scrape time.

What each read costs is in ``runner.figures``: a scrape reads small tables and index
ends, never counts the leads or the outbox, so its store time does not grow with the
store.  On PostgreSQL every process serving the same store reports the same figures.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from runner.clock import Clock
from runner.leads.states import LeadState

if TYPE_CHECKING:
    from runner.figures import FiguresStore


def _age(at: str | None, now: datetime) -> float:
    if at is None:
        return 0.0
    return max(0.0, (now - datetime.fromisoformat(at)).total_seconds())


def _timestamp(at: str | None) -> float:
    return datetime.fromisoformat(at).timestamp() if at else 0.0


async def read_figures(store: FiguresStore, clock: Clock) -> list[Metric]:
    from runner.pipeline.report import builtin_refs, current_refs
    from runner.pipeline.stages import raw_ingestion

    now = clock.now()
    leads = await store.lead_figures()
    by_state = GaugeMetricFamily("runner_leads", "lead records in the store, by state",
                                 labels=["state"])
    for state, n in leads.counts.items():
        by_state.add_metric([state.value], n)
    uncertain = GaugeMetricFamily(
        "runner_uncertain_leads",
        "records whose send may have happened: reconciled by readback only, never resent",
        value=leads.counts.get(LeadState.UNCERTAIN, 0))
    oldest = GaugeMetricFamily(
        "runner_oldest_uncertain_age_seconds",
        "age (since accept) of the oldest uncertain record; 0 when there is none",
        value=_age(leads.oldest_uncertain_accepted_at, now))
    last_seq = await store.outbox_last_seq()
    outbox = GaugeMetricFamily("runner_outbox_last_seq", "the outbox's last sequence number",
                               value=last_seq)

    failing = leads.poll_failing_since
    poll = GaugeMetricFamily("runner_poll_failing",
                             "1 while status reads fail (an open poll-health run), else 0",
                             value=1 if failing else 0)
    poll_since = GaugeMetricFamily(
        "runner_poll_failing_since_timestamp_seconds",
        "when the open poll-health run began; 0 when polls are healthy",
        value=_timestamp(failing))

    candidates = await store.candidate_summary()
    by_status = GaugeMetricFamily("runner_candidates", "candidates, by status",
                                  labels=["status"])
    for status, n in candidates.counts.items():
        by_status.add_metric([status.value], n)
    sweep = GaugeMetricFamily(
        "runner_last_sweep_changed", "candidates the last sweep changed, by what it did",
        labels=["change"])
    last = candidates.last_sweep
    for change in ("expired", "reconciled"):
        sweep.add_metric([change], last.result.get(change, 0) if last is not None else 0)
    sweep_at = GaugeMetricFamily(
        "runner_last_sweep_timestamp_seconds",
        "the 'now' of the last candidate sweep any process ran; 0 before the first",
        value=last.at.timestamp() if last is not None else 0.0)

    refs = current_refs(builtin_refs(), await store.registered_processors())
    counts = await store.backlog(refs)
    backlog = GaugeMetricFamily("runner_pipeline_backlog",
                                "inputs pending per stage and processor version",
                                labels=["stage", "processor"])
    for ref in refs:
        backlog.add_metric([ref.stage.value, ref.label], counts.get(ref.label, 0))
    cursor = await store.cursor_position(raw_ingestion.CURSOR)
    raw_lag = GaugeMetricFamily(
        "runner_pipeline_raw_lag_events",
        "outbox events after the raw retriever's cursor (an upper bound of raw ingestion's "
        "backlog)", value=max(0, last_seq - cursor))
    return [by_state, uncertain, oldest, outbox, poll, poll_since, by_status, sweep,
            sweep_at, backlog, raw_lag]
