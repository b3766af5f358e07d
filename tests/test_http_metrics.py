"""/metrics over real HTTP (issue 18 point 3): Prometheus text through prometheus_client,
the store's figures equal to what ``status`` counts (both backends, also after a
migration), process counters fed by intake and by cycles."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runner import DurableWorker
from runner.io.faults import Fault, FaultyAdapter
from runner.io.stores import open_store
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.states import LeadState
from tests.helpers import SCOPE, event, run_cli, write_json
from tests.httpkit import body_of, serving

pytestmark = pytest.mark.timeout(60)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def cycle(db: str, target: Path, *faults: Fault) -> None:
    adapter: Any = SyntheticTarget(str(target))
    try:
        if faults:
            adapter = FaultyAdapter(adapter, frozenset(faults))
        # retry_base 0: a record not sent is due again at the next cycle
        async with DurableWorker(db, SCOPE, adapter, retry_base=0) as worker:
            await worker.run_cycle()
    finally:
        (adapter.inner if faults else adapter).close()


async def test_metrics_show_the_store_and_what_this_process_did(
        db_location: str, workdir: Path) -> None:
    async with serving(db_location) as s:
        for i in range(3):
            assert (await s.post(body_of(event(i)))).status_code == 200
        assert (await s.post(body_of(event(0)))).json()["result"] == "duplicate"
        assert (await s.post(b"{", )).status_code == 400
        await cycle(db_location, workdir / "t.db", Fault.TIMEOUT)  # all three uncertain
        for i in range(3, 5):
            await s.post(body_of(event(i)))
        response = await s.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        found = samples(response.text)
        async with s.worker.store.reading():
            counts = (await s.worker.store.summary()).counts
        for state in LeadState:
            assert value(found, "runner_leads", state=state.value) == counts[state]
        assert value(found, "runner_leads", state="uncertain") == 3
        assert value(found, "runner_uncertain_leads") == 3
        assert value(found, "runner_oldest_uncertain_age_seconds") >= 0
        assert value(found, "runner_intake_records_total", result="accepted", reason="") == 5
        assert value(found, "runner_intake_records_total", result="duplicate", reason="") == 1
        assert value(found, "runner_intake_records_total", result="rejected",
                     reason="invalid_json") == 1
        assert value(found, "runner_http_requests_total", route="webhook", code="200") == 6
        assert value(found, "runner_http_requests_total", route="webhook", code="400") == 1
        assert value(found, "runner_http_request_seconds_count", route="webhook") == 7
        assert value(found, "runner_intake_commit_records_count") >= 1
        assert value(found, "runner_poll_failing") == 0
        assert value(found, "runner_pipeline_raw_lag_events") >= 5
        assert ("runner_pipeline_backlog", (("processor", "lead-facts@1"),
                                            ("stage", "core_processing"))) in found
        await cycle(db_location, workdir / "t.db")  # reconciles 3, sends 2
        again = samples((await s.get("/metrics")).text)
        assert value(again, "runner_leads", state="confirmed") == 5
        assert value(again, "runner_uncertain_leads") == 0
        assert value(again, "runner_oldest_uncertain_age_seconds") == 0


async def test_cycles_feed_the_process_counters(db_location: str, workdir: Path) -> None:
    from runner.tasks.outcomes import CycleSummary

    async with serving(db_location, mode="start") as s:
        s.service.on_cycle(CycleSummary(dispatched=4, confirmed=3, uncertain=1, polled=2))
        found = samples((await s.get("/metrics")).text)
    assert value(found, "runner_cycles_total") == 1
    assert value(found, "runner_cycle_records_total", outcome="confirmed") == 3
    assert value(found, "runner_cycle_records_total", outcome="uncertain") == 1
    assert value(found, "runner_cycle_dispatched_records_sum") == 4
    assert value(found, "runner_last_cycle_timestamp_seconds") > 1.7e9


async def test_the_kept_counts_equal_a_count_of_the_leads(
        db_location: str, workdir: Path) -> None:
    """Triggers keep lead_counts in the transaction of every insert and state change: after
    group commits with duplicates and conflicts, and every kind of transition, the kept
    counts are exactly a count of the table."""
    async with DurableWorker(db_location, SCOPE) as worker:
        docs: list[Any] = [event(i) for i in range(40)]
        docs += [event(3), event(4, contact_alias="changed"), event(41)]
        await worker.accept_many(docs)
    await cycle(db_location, workdir / "t.db", Fault.OUTAGE)  # failed_safe
    await cycle(db_location, workdir / "t.db", Fault.TIMEOUT)  # uncertain
    async with DurableWorker(db_location, SCOPE) as worker:
        await worker.accept_many([event(i) for i in range(50, 60)])
    await cycle(db_location, workdir / "t.db")  # confirmed
    async with await open_store(db_location, create=False) as store:
        figures = await store.lead_figures()
        async with store.reading():
            counted = (await store.summary()).counts
    assert figures.counts == counted
    assert sum(counted.values()) == 51 and counted[LeadState.CONFIRMED] == 51


@pytest.mark.usefixtures("sqlite_only")
async def test_a_v1_store_gains_counts_of_the_records_it_holds(
        workdir: Path, scope_file: Path) -> None:
    db = workdir / "queue.db"
    shutil.copy(Path(__file__).parent / "fixtures" / "store-v1.sqlite", db)
    db.chmod(0o600)
    rec = write_json(workdir / "e.json", event(9))
    assert run_cli("accept", "--db", db, "--scope", scope_file, "--record", rec
                   ).returncode == 0  # migrates to the latest version
    conn = sqlite3.connect(db)
    try:
        kept = dict(conn.execute("SELECT state, n FROM lead_counts WHERE n > 0"))
        counted = dict(conn.execute("SELECT state, count(*) FROM leads GROUP BY state"))
    finally:
        conn.close()
    assert kept == counted and sum(kept.values()) == 4
