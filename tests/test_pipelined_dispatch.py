"""The pipelined dispatch (issue 32, ``--dispatch-pipeline``; ``PIPELINE=1`` in the model):
the commit of a batch's in-flight mark, with the outcomes of the request before, runs
while the batch before is at the target.  In process: the next batch is in flight while
the request before is out (and only when pipelined), on both stores, and by default only
on a target that deduplicates.  As a user runs it (real processes): a crash inside a
pipelined batch loses nothing and duplicates nothing, and what it leaves uncertain is
settled by one ``resolve --all``; a graceful stop sends no batch it had marked."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import anyio.from_thread
import pytest

from runner import DurableWorker
from runner.errors import StoreError
from runner.leads.models import CRMRecord
from tests.fakes import sheet_rows
from tests.helpers import SCOPE, Child, CliStore, event, last_json, run_main, wait_path
from tests.test_batch_dispatch import BatchingAdapter

pytestmark = pytest.mark.timeout(120)


async def _accepted(worker: DurableWorker, n: int) -> None:
    await worker.accept_many([event(i) for i in range(n)])


class _DedupingBatches(BatchingAdapter):
    """The batching sheet, deduplicating: a write of a write_id the sheet holds adds no
    row."""

    dedupes_write_id = True

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sheet.prepare_writes(True)  # made at once: its first read finds no row

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        held = {row.write_id for row in self.sheet.read_back_many([w for _, w in items])}
        super().write_batch([(r, w) for r, w in items if w not in held])


def _watching(adapter: BatchingAdapter, worker: DurableWorker, wait: bool) -> list[set[str]]:
    """Make the adapter's first request look at the store while it is out: the states
    of the records of the batch after it (the 4th to 6th accepted), once they are all in
    flight (``wait``: up to 10 s, polled) or at once."""
    seen: list[set[str]] = []
    write_batch = adapter.write_batch
    later = {event(i)["source_lead_id"] for i in (3, 4, 5)}

    async def states() -> set[str]:
        return {r.state.value async for r in worker.store.iter_records()
                if r.source_lead_id in later}

    def first_looks(items: Sequence[tuple[CRMRecord, str]]) -> None:
        if not seen:
            deadline = time.monotonic() + (10 if wait else 0)
            while True:
                now = anyio.from_thread.run(states)
                if now == {"in_flight"} or time.monotonic() >= deadline:
                    break
                time.sleep(0.01)  # polling a condition, bounded by the deadline
            seen.append(now)
        write_batch(items)

    adapter.write_batch = first_looks  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "serial"])
async def test_the_next_batch_is_marked_while_the_batch_before_is_at_the_target(
    db_location: str, workdir: Path, pipeline: bool
) -> None:
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3,
                             dispatch_pipeline=pipeline) as worker:
        await _accepted(worker, 7)
        seen = _watching(adapter, worker, wait=pipeline)
        summary = await worker.run_cycle()
        states = {r.state.value async for r in worker.store.iter_records()}
    # pipelined, the second batch's mark committed while the first request was out;
    # serial, it was still prepared then
    assert seen == [{"in_flight"} if pipeline else {"prepared"}]
    assert [len(r) for r in adapter.requests] == [3, 3, 1]  # in mark order, one at a time
    assert (summary.dispatched, summary.confirmed, summary.uncertain) == (7, 7, 0)
    assert states == {"confirmed"}
    keys = [row[4] for row in sheet_rows(workdir / "t.db")]
    assert len(keys) == len(set(keys)) == 7


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "serial"])
async def test_one_run_spans_the_pages_and_a_batch_may_cross_a_page_boundary(
    db_location: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, pipeline: bool
) -> None:
    """Pages of 4, batches of 3: the second batch takes the last record of the first page
    and the first two of the second, and (pipelined) is marked while the first request is
    out, so no page's end drains the pipeline."""
    monkeypatch.setattr("runner.tasks.deliver.BATCH_PAGE", 4)
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3,
                             dispatch_pipeline=pipeline) as worker:
        await _accepted(worker, 10)
        seen = _watching(adapter, worker, wait=pipeline)
        summary = await worker.run_cycle()
        states = {r.state.value async for r in worker.store.iter_records()}
    assert seen == [{"in_flight"} if pipeline else {"prepared"}]
    assert [len(r) for r in adapter.requests] == [3, 3, 3, 1]
    assert (summary.dispatched, summary.confirmed) == (10, 10)
    assert states == {"confirmed"}
    keys = [row[4] for row in sheet_rows(workdir / "t.db")]
    assert len(keys) == len(set(keys)) == 10


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "serial"])
async def test_a_failed_page_read_ends_the_run_and_records_what_was_sent(
    db_location: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, pipeline: bool
) -> None:
    """The second page's read fails: the run ends when it reaches that page, raising the
    read's error; the first page's outcomes are committed, nothing of the second page is
    marked, and the next cycle delivers it."""
    monkeypatch.setattr("runner.tasks.deliver.BATCH_PAGE", 3)
    adapter = BatchingAdapter(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3,
                             dispatch_pipeline=pipeline) as worker:
        await _accepted(worker, 5)
        store = worker.store
        page = store.dispatchable_page
        failing = [True]

        async def reading(after_seq: int, limit: int, now: datetime | None = None) -> list:
            if after_seq and failing[0]:
                failing[0] = False
                raise StoreError("the page read failed (synthetic)")
            return await page(after_seq, limit, now)

        monkeypatch.setattr(store, "dispatchable_page", reading)
        with pytest.raises(StoreError, match="synthetic"):
            await worker.run_cycle()
        first = {r.source_lead_id: r.state.value async for r in store.iter_records()}
        assert [len(r) for r in adapter.requests] == [3]
        assert sorted(first.values()) == ["confirmed"] * 3 + ["prepared"] * 2
        summary = await worker.run_cycle()
        states = {r.state.value async for r in store.iter_records()}
    assert summary.confirmed == 2 and states == {"confirmed"}
    assert [len(r) for r in adapter.requests] == [3, 2]


@pytest.mark.parametrize("dedupes", [True, False], ids=["deduplicating", "plain"])
async def test_by_default_only_a_deduplicating_target_is_pipelined(
    db_location: str, workdir: Path, dedupes: bool
) -> None:
    """``dispatch_pipeline`` None (``--dispatch-pipeline auto``): pipelined for a target
    that deduplicates by write_id (a crash that leaves two batches uncertain costs no
    operator command there: runner sends them again itself), serial for any other."""
    adapter = (_DedupingBatches if dedupes else BatchingAdapter)(workdir / "t.db")
    async with DurableWorker(db_location, SCOPE, adapter, batch_size=3) as worker:
        assert worker.dispatch_pipeline is None
        await _accepted(worker, 7)
        seen = _watching(adapter, worker, wait=dedupes)
        summary = await worker.run_cycle()
    assert seen == [{"in_flight"} if dedupes else {"prepared"}]
    assert summary.confirmed == 7


# -- as a user runs it (real processes) ---------------------------------------------------


@pytest.mark.parametrize("point", [
    pytest.param("dispatch.after-in-flight", marks=pytest.mark.slow),
    pytest.param("dispatch.batch-applied", marks=pytest.mark.slow),
    "dispatch.after-write",
    pytest.param("dispatch.batch-mid-readback", marks=pytest.mark.slow),
    "dispatch.before-confirm",
])
def test_a_crash_inside_a_pipelined_batch_loses_nothing_and_duplicates_nothing(
    cli_store: CliStore, point: str
) -> None:
    """Seven records, batches of 3: the crash falls in the first request, while the
    second batch's mark commits beside it (before the crash or not: both are states the
    model checks), or (``dispatch.before-confirm``) in the commit beside the second.
    What landed is confirmed by readback, nothing is resent, and what is left uncertain
    (the first batch if it did not land, the second, never sent) is settled by one
    ``resolve --all`` on this target, which cannot deduplicate.  Two points in the
    default run, the other three in the slow tier."""
    s = cli_store
    s.accept(*range(1, 8))
    crashed = s.once("--batch-size", "3", "--dispatch-pipeline", "on", "--fault",
                     f"crash-at:{point}@1")
    assert crashed.returncode == 73 and crashed.stdout == "", crashed.stderr
    in_flight = {k for k, r in s.records().items() if r["state"] == "in_flight"}
    first = {"lead-1", "lead-2", "lead-3"}
    assert in_flight in (first, first | {"lead-4", "lead-5", "lead-6"})
    landed = len(sheet_rows(s.target))
    # the first dispatch.before-confirm is the second batch's step: the commit of the
    # first batch's outcomes beside the second batch's request, which may have landed
    assert landed in {"dispatch.after-in-flight": {0},
                      "dispatch.before-confirm": {3, 6}}.get(point, {3})
    healed = s.cli("once", "--batch-size", "3", "--dispatch-pipeline", "on")
    assert healed["recovered"] == len(in_flight)
    assert healed["reconciled"] == landed
    assert healed["still_uncertain"] == len(in_flight) - landed
    again = s.cli("once", "--batch-size", "3", "--dispatch-pipeline", "on")
    assert again["dispatched"] == 0  # nothing uncertain is ever resent
    proc = run_main("resolve", "--db", s.db, "--target", s.target, "--all", "--as",
                    "not-sent", "--reason", "the batch crashed before its request")
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["decided"] == len(in_flight) - landed
    s.cli("once", "--batch-size", "3", "--dispatch-pipeline", "on")
    recs = s.records()
    assert len(recs) == 7 and {r["state"] for r in recs.values()} == {"confirmed"}
    keys = [r[4] for r in sheet_rows(s.target)]
    assert len(keys) == len(set(keys)) == 7  # 0 lost, 0 duplicated


def test_a_graceful_stop_sends_no_batch_it_had_marked(cli_store: CliStore,
                                                      workdir: Path) -> None:
    """The request in flight finishes; the batch marked beside it is never sent: it is
    recorded failed-safe ("not sent", due at once) and the next run sends it."""
    s, hang = cli_store, workdir / "hang"
    s.accept(1, 2, 3, 4)
    hang.mkdir()
    child = Child("start", "--db", s.db, "--scope", s.scope, "--target", s.target,
                  "--interval", "3600", "--batch-size", "3", "--dispatch-pipeline", "on",
                  "--fault", "hang", env={"RUNNER_HANG_DIR": str(hang)})
    try:
        wait_path(hang / "entered-write", child)
        child.signal(signal.SIGTERM)
        child.wait_err("letting the send in flight finish")
        (hang / "release").touch()
        code = child.finish(timeout=15)
    finally:
        child.kill()
    assert code == 0
    summary = last_json("\n".join(child.out))
    assert (summary["dispatched"], summary["confirmed"], summary["uncertain"]) == (3, 3, 0)
    recs = s.records()
    assert [recs[f"lead-{i}"]["state"] for i in (1, 2, 3)] == ["confirmed"] * 3
    # marked beside the request (it had its mark by the time the request was released,
    # or the stop came first and it was never marked)
    assert recs["lead-4"]["state"] in ("failed_safe", "prepared")
    assert len(sheet_rows(s.target)) == 3
    healed = s.cli("once", "--batch-size", "3")
    assert (healed["dispatched"], healed["still_uncertain"]) == (1, 0)
    assert {r["state"] for r in s.records().values()} == {"confirmed"}
    assert len(sheet_rows(s.target)) == 4
