"""Synthetic candidates for the lifecycle tests: made-up ids, analysts and decisions."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from runner.candidates import Candidate
from runner.candidates.rules import new_candidate
from runner.store import Store
from tests.helpers import run_main

#: the seed's date; every test time is relative to it
T0 = datetime(2026, 8, 11, 12, 0, tzinfo=UTC)


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def add(
    store: Store,
    cid: str,
    *,
    created: datetime = T0,
    analysts: tuple[str, ...] = (),
    quorum: int = 2,
    ttl_minutes: float = 30,
    deadline: datetime | None = None,
) -> Candidate:
    """Add a candidate and record its analyses (each at its creation time)."""
    candidate = await store.add_candidate(new_candidate(
        cid, created, quorum=quorum, ttl=timedelta(minutes=ttl_minutes),
        analysis_deadline=deadline))
    for analyst in analysts:
        candidate = await store.analyze_candidate(cid, analyst, created)
    return candidate


async def promoting(store: Store, cid: str, locked: datetime, *, decision: str | None
                    ) -> Candidate:
    """A candidate stuck promoting since ``locked`` (with or without its decision), as a
    process that died between the steps leaves it."""
    await add(store, cid, created=locked - timedelta(minutes=1), analysts=("a1", "a2"))
    candidate = await store.begin_promotion(cid, locked)
    if decision is not None:
        candidate = await store.record_decision(cid, decision, locked)
    return candidate


async def promoted(store: Store, cid: str, when: datetime = T0) -> Candidate:
    await promoting(store, cid, when, decision=f"decision-{cid}")
    return await store.finish_promotion(cid, when)


async def snapshot(store: Store) -> tuple[list[dict[str, Any]], int, int]:
    """Every candidate, the outbox length and its last sequence: equal before and after
    means nothing changed (backend-neutral)."""
    async with store.reading():
        candidates = [c.to_json() async for c in store.iter_candidates()]
        summary = await store.summary()
    return candidates, summary.outbox_count, summary.outbox_last_seq


async def statuses(store: Store) -> dict[str, str]:
    return {c.id: c.status.value async for c in store.iter_candidates()}


def cli(db: Path, *args: str, ok: bool = True) -> Any:
    """Run ``python run.py ARGS --db DB``; with ``ok``, expect exit 0 and one JSON line
    (returned parsed); without, return the finished process."""
    proc = run_main(*args, "--db", db)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("\n") == 1, proc.stdout
        return json.loads(proc.stdout)
    return proc


class FakeTime:
    """A clock that moves only when someone sleeps on it (or a test says so)."""

    def __init__(self, moment: datetime) -> None:
        self.at = moment
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.at += timedelta(seconds=seconds)
        await anyio.lowlevel.checkpoint()
