"""Acceptance M1-M6 of seed ``001_*`` (V2-CH2-005), each its own test."""

from __future__ import annotations

from datetime import datetime

import anyio

from runner.candidates import SweepResult
from runner.status import status_document
from runner.store import Store
from runner.tasks.sweep import run_sweep_schedule
from tests.helpers import last_json, run_main
from tests.lifecycle_fixtures import (
    FakeTime,
    add,
    at,
    cli,
    iso,
    promoted,
    promoting,
    statuses,
)


async def test_m1_sweep_expired_marks_past_expiry_or_past_deadline_as_expired(
    store: Store,
) -> None:
    await add(store, "past-expiry", ttl_minutes=10)
    await add(store, "past-deadline", analysts=("a1",), deadline=at(5))
    await add(store, "in-time")
    await add(store, "deadline-with-quorum", analysts=("a1", "a2"), deadline=at(5))
    assert await store.sweep_expired(at(10, seconds=1)) == {"expired": 2}
    assert await statuses(store) == {
        "past-expiry": "expired", "past-deadline": "expired",
        "in-time": "discovered", "deadline-with-quorum": "analyzing",
    }


async def test_m2_reconcile_handles_promotions_stuck_more_than_60_seconds(store: Store) -> None:
    await promoting(store, "decided", at(1), decision="dec-1")
    await promoting(store, "undecided", at(1), decision=None)
    await promoting(store, "recent", at(1, seconds=2), decision=None)
    assert await store.reconcile_stuck_promoting(at(2, seconds=1)) == {"reconciled": 2}
    assert await statuses(store) == {
        "decided": "promoted", "undecided": "rejected", "recent": "promoting"}


async def test_m3_the_workflow_sweeps_the_store_every_5_minutes(store: Store) -> None:
    """The declared workflow, run by its task over a real store (injected time)."""
    await add(store, "c1", ttl_minutes=4)        # expires 12:04, swept at 12:05
    time = FakeTime(at(3, seconds=17))
    runs: list[datetime] = []
    second = anyio.Event()

    class Counting:
        async def sweep_candidates(self, now: datetime) -> SweepResult:
            result = await store.sweep_candidates(now)
            runs.append(now)
            if len(runs) == 2:
                second.set()
            return result

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_sweep_schedule(Counting(), time, sleep=time.sleep))
            await second.wait()
            tg.cancel_scope.cancel()
    assert runs == [at(3, seconds=17), at(5)]
    lifecycle = (await status_document(store))["lifecycle"]
    assert lifecycle["schedule"]["name"] == "Candidate Lifecycle Sweep"
    assert lifecycle["schedule"]["function"] == "sweepCandidates"
    assert lifecycle["last_sweep"] == {"function": "sweepCandidates",
                                       "at": "2026-08-11T12:05:00.000000Z",
                                       "result": {"expired": 1, "reconciled": 0}}
    assert lifecycle["counts"]["expired"] == 1


def test_m4_an_expired_candidate_is_never_promoted_only_expired(db_location: str) -> None:
    db = db_location
    for cid, created in (("swept", at(0)), ("late", at(5))):
        cli(db, "candidate", "add", "--id", cid, f"--now={iso(created)}")
        for analyst in ("a1", "a2"):                              # both reach quorum
            cli(db, "candidate", "analyze", "--id", cid, "--analyst", analyst,
                f"--now={iso(created)}")
    assert cli(db, "sweep", f"--now={iso(at(30, seconds=1))}")["expired"] == 1  # swept
    # swept: refused, even with an earlier --now; late: past expiry, not yet swept
    for cid, when in (("swept", at(31)), ("swept", at(10)), ("late", at(35, seconds=1))):
        proc = cli(db, "candidate", "promote", "--id", cid, "--decision-id", "d1",
                   f"--now={iso(when)}", ok=False)
        assert proc.returncode == 65 and "expired" in proc.stderr, proc.stderr
    assert cli(db, "sweep", f"--now={iso(at(35, seconds=1))}") == {"expired": 1,
                                                                    "reconciled": 0}
    listed = cli(db, "candidate", "list")
    assert [(c["id"], c["status"], c["decision_id"]) for c in listed] == [
        ("swept", "expired", None), ("late", "expired", None)]


async def test_m5_promoted_rejected_and_expired_are_kept(store: Store) -> None:
    await promoted(store, "c-promoted", at(1))
    await promoting(store, "c-rejected", at(1), decision=None)
    await add(store, "c-expired")
    for minutes in (31, 60 * 24, 60 * 24 * 365 * 3):
        await store.sweep_candidates(at(minutes))
    async with store.reading():
        kept = {c.id: c.status.value async for c in store.iter_candidates()}
        summary = await store.candidate_summary()
    assert kept == {"c-promoted": "promoted", "c-rejected": "rejected",
                    "c-expired": "expired"}
    assert sum(summary.counts.values()) == 3


def test_m6_the_seeds_trial_run_returns_expired_3_reconciled_0(db_location: str) -> None:
    db = db_location
    now0 = f"--now={iso(at(0))}"
    cli(db, "candidate", "add", "--id", "cand-1", now0)                       # T3
    cli(db, "candidate", "add", "--id", "cand-2", "--ttl-minutes", "20", now0)  # T3
    cli(db, "candidate", "add", "--id", "cand-3", "--ttl-minutes", "60",       # T4
        "--analysis-deadline", iso(at(25)), now0)
    cli(db, "candidate", "analyze", "--id", "cand-3", "--analyst", "a1", now0)
    cli(db, "candidate", "add", "--id", "cand-4", "--ttl-minutes", "60", now0)  # in time
    cli(db, "candidate", "add", "--id", "cand-5", "--ttl-minutes", "60", now0)  # promoted
    for analyst in ("a1", "a2"):
        cli(db, "candidate", "analyze", "--id", "cand-5", "--analyst", analyst, now0)
    cli(db, "candidate", "promote", "--id", "cand-5", "--decision-id", "dec-5", now0)
    assert cli(db, "sweep", f"--now={iso(at(31))}") == {"expired": 3, "reconciled": 0}
    status = last_json(run_main("status", "--db", db).stdout)["lifecycle"]
    assert status["last_sweep"]["result"] == {"expired": 3, "reconciled": 0}
    assert status["counts"] == {"discovered": 1, "analyzing": 0, "promoting": 0,
                                "promoted": 1, "rejected": 0, "expired": 3}
