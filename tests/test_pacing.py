"""Pacing and backoff (issue 16 points 3 and 4).

The pacer (a token bucket) and the backoff are driven by injected clocks, never by wall
time; the backoff runs through the library on both backends; the CLI as a user runs it
(``--now`` replaces the clock across separate runs); and a real ``start`` process against
a target that answers "rate limited" delivers everything exactly once.  The pacer in
dispatch, the batched reconcile pass and polling, and the separate read and write quotas,
are ``tests/test_pacing_dispatch.py``'s.
"""

from __future__ import annotations

import itertools
import json
import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.clock import to_text
from runner.errors import UsageError
from runner.leads.models import CRMRecord
from runner.leads.pacing import Backoff, parse_duration, parse_rate
from runner.leads.port import BeforeWriteError
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, Child, CliStore, event, last_json, run_main, worker_records
from tests.pacingkit import T0, FakeTime, StepClock

# -- the pacer and the backoff, pure ---------------------------------------------------


def test_the_pacer_spaces_requests_evenly_by_the_quota() -> None:
    clock = FakeTime()
    pacer = clock.pacer(rate=2.0)  # 120/min
    sent = []
    for _ in range(6):
        pacer.take_blocking()
        sent.append(clock.t)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert sent[0] == 1000.0 and gaps == [0.5] * 5
    # no window of one second holds more than the quota's two requests
    assert all(sum(1 for s in sent if t <= s < t + 1.0) <= 2 for t in sent)


def test_a_burst_is_spent_at_once_then_the_rate_holds() -> None:
    clock = FakeTime()
    pacer = clock.pacer(rate=1.0, burst=3)
    sent = []
    for _ in range(5):
        pacer.take_blocking()
        sent.append(clock.t - 1000.0)
    assert sent == [0.0, 0.0, 0.0, 1.0, 2.0]


def test_a_rate_limited_answer_holds_every_later_request() -> None:
    clock = FakeTime()
    pacer = clock.pacer(rate=None)  # no quota: only the target's answer holds
    assert pacer.reserve() == 0.0
    pacer.hold(30.0)
    assert pacer.reserve() == 30.0
    clock.t += 30.0
    assert pacer.reserve() == 0.0
    pacer.hold(None)  # no retry_after: the pacer's default hold
    assert pacer.reserve() == pacer.default_hold > 0


def test_a_wait_for_a_token_ends_at_a_stop_and_sends_nothing() -> None:
    clock = FakeTime()
    pacer = clock.pacer(rate=None)
    pacer.hold(60.0)
    stopped: list[bool] = []

    def stop() -> bool:
        stopped.append(clock.t > 1001.0)  # the stop arrives after a second of waiting
        return stopped[-1]

    assert pacer.pause(pacer.reserve(), stop) is False
    assert 1001.0 < clock.t < 1002.0  # woke at the next slice, not after 60 s


def test_backoff_doubles_with_jitter_and_stops_at_its_cap() -> None:
    low, high = Backoff(1.0, 60.0, rand=lambda: 0.0), Backoff(1.0, 60.0, rand=lambda: 1.0)
    assert [low.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [high.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert high.delay(10_000) == 60  # no overflow, however many attempts
    # the target's own retry_after wins over the exponential, within the cap
    assert low.next_attempt(9, T0, retry_after=3.0) == T0 + timedelta(seconds=3)
    assert low.next_attempt(1, T0, retry_after=999.0) == T0 + timedelta(seconds=60)
    assert Backoff(0.0, 60.0).next_attempt(5, T0) == T0  # base 0: due at once


@pytest.mark.parametrize(("text", "per_second"), [
    ("60/min", 1.0), ("2/s", 2.0), ("3", 3.0), ("90/m", 1.5), ("3600/h", 1.0)])
def test_rates_are_read_per_time(text: str, per_second: float) -> None:
    assert parse_rate(text) == per_second


@pytest.mark.parametrize("text", ["fast", "0/min", "-1/s", "5/week", "inf/s", "nan"])
def test_a_bad_rate_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="requests per time"):
        parse_rate(text)


def test_durations_are_read_with_their_unit() -> None:
    assert [parse_duration(t) for t in ("1s", "500ms", "5min", "2m", "1h", "7")] == [
        1.0, 0.5, 300.0, 120.0, 3600.0, 7.0]
    with pytest.raises(UsageError, match="such as 1s"):
        parse_duration("soon")


@pytest.mark.parametrize(("argv", "message"), [
    (["--target-rate", "fast"], "--target-rate: rate 'fast'"),
    (["--target-read-rate", "0/min"], "--target-read-rate: rate '0/min'"),
    (["--retry-base=-1s"], "--retry-base: duration '-1s'"),
    (["--retry-base", "10min", "--retry-cap", "1s"], "must not exceed --retry-cap"),
])
def test_bad_pacing_options_are_refused_before_anything_changes(
    cli_store: CliStore, argv: list[str], message: str
) -> None:
    cli_store.accept(1)
    out = cli_store.once(*argv)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert cli_store.records()["lead-1"]["state"] == "prepared"


def test_the_pacing_options_come_from_the_configuration_file(
    cli_store: CliStore, workdir: Path
) -> None:
    config = workdir / "runner.toml"
    config.write_text('target-rate = "fast"\n')
    out = cli_store.once("--config", config)
    assert out.returncode == 2 and "target-rate" in out.stderr and "fast" in out.stderr
    config.write_text('target-read-rate = "often"\n')
    out = cli_store.once("--config", config)
    assert out.returncode == 2 and "target-read-rate" in out.stderr, out.stderr
    config.write_text('target-rate = "600/min"\ntarget-read-rate = "600/min"\n'
                      '[once]\nretry-base = "2s"\n')
    cli_store.accept(1)
    out = cli_store.once("--config", config)
    assert out.returncode == 0 and last_json(out.stdout)["confirmed"] == 1, out.stderr


# -- backoff through the store ----------------------------------------------------------


class Outage(ScriptedAdapter):
    """The scripted sheet, failing the first ``failures`` writes as "not sent"."""

    def __init__(self, path: Path, failures: int) -> None:
        super().__init__(path)
        self.failures = failures
        self.calls = 0

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise BeforeWriteError("scripted outage: not sent")
        super().write(record, write_id)


async def _outbox_count(worker: DurableWorker) -> int:
    return int((await worker.status())["outbox"]["count"])


async def test_a_failed_safe_record_waits_out_its_backoff_also_across_a_restart(
    db_location: str, workdir: Path
) -> None:
    adapter, clock = Outage(workdir / "t.db", failures=2), StepClock()
    jitter_free = Backoff(10.0, 300.0, rand=lambda: 1.0)  # the first wait 10 s, then 20 s
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock) as worker:
        worker.backoff = jitter_free
        await worker.accept(event(1))
        assert (await worker.run_cycle()).failed_safe == 1
        status = await worker.status()
    first_retry = T0 + timedelta(seconds=10)
    assert status["retries"] == {"waiting": 1, "next_attempt_at": to_text(first_retry),
                                 "rejected": 0}
    events = status["outbox"]["count"]

    # a restart (a new worker on the same store): the schedule is the store's
    clock.at = first_retry - timedelta(seconds=1)
    async with DurableWorker(db_location, SCOPE, adapter, clock=clock) as worker:
        worker.backoff = jitter_free
        for _ in range(3):  # not due: not sent, and nothing written about it
            summary = await worker.run_cycle()
            assert (summary.dispatched, summary.failed_safe) == (0, 0)
        assert await _outbox_count(worker) == events
        assert adapter.calls == 1

        clock.at = first_retry  # due: sent (and it fails again), the wait doubles
        assert (await worker.run_cycle()).failed_safe == 1
        status = await worker.status()
        assert status["retries"]["next_attempt_at"] == to_text(first_retry
                                                               + timedelta(seconds=20))
        assert status["outbox"]["count"] == events + 2  # in_flight, failed_safe: once

        clock.at = first_retry + timedelta(seconds=20)
        assert (await worker.run_cycle()).confirmed == 1
        status = await worker.status()
        records = await worker_records(worker)
    assert adapter.calls == 3 and len(sheet_rows(workdir / "t.db")) == 1
    assert status["retries"] == {"waiting": 0, "next_attempt_at": None, "rejected": 0}
    assert records[0]["attempts"] == 3


def test_the_cli_keeps_the_backoff_schedule_between_runs(cli_store: CliStore) -> None:
    """Separate ``once`` runs, the clock given by ``--now``: a retry not yet due is not
    sent and writes no outbox event; ``status`` says how many wait and until when."""
    s = cli_store
    s.accept(1)
    at = "2026-11-30T12:00:00Z"
    out = s.once("--fault", "outage", "--retry-base", "1min", "--now", at)
    assert out.returncode == 0 and last_json(out.stdout)["failed_safe"] == 1, out.stderr
    status = s.status()
    waiting = status["retries"]
    assert waiting["waiting"] == 1
    due = datetime.fromisoformat(waiting["next_attempt_at"].replace("Z", "+00:00"))
    assert T0 + timedelta(seconds=30) <= due <= T0 + timedelta(seconds=60)  # jitter: 30-60 s
    events = status["outbox"]["count"]

    early = s.once("--now", "2026-11-30T12:00:29Z")
    assert early.returncode == 0 and last_json(early.stdout)["dispatched"] == 0
    assert s.status()["outbox"]["count"] == events and sheet_rows(s.target) == []

    late = s.once("--now", "2026-11-30T12:01:00Z")
    assert last_json(late.stdout)["confirmed"] == 1, late.stderr
    assert s.status()["retries"] == {"waiting": 0, "next_attempt_at": None, "rejected": 0}
    assert len(sheet_rows(s.target)) == 1


# -- a real process against a rate-limited target --------------------------------------


def _confirmed(child: Child) -> int:
    total = 0
    for line in child.out:
        try:
            total += int(json.loads(line).get("confirmed", 0))
        except ValueError:
            continue
    return total


def test_a_rate_limited_target_gets_every_record_once(cli_store: CliStore) -> None:
    """``start --fault rate-limited``: the target keeps a quota of two writes a second and
    answers the rest "rate limited"; those records wait for the target's retry_after and
    are sent again.  Everything is delivered, nothing twice."""
    s = cli_store
    s.accept(*range(1, 13))
    child = Child("start", "--db", s.db, "--scope", s.scope, "--target", s.target,
                  "--fault", "rate-limited", "--batch-size", "2", "--interval", "0.05")
    try:
        child.wait_for(lambda c: _confirmed(c) >= 12, timeout=60, what="12 confirmed")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    refused = [line for line in child.err if ".failed_safe" in line]  # one line a batch
    assert refused and all("next_attempt_at" in line and "reason=rate_limited" in line
                           for line in refused)  # it did refuse
    doc = s.status()
    assert doc["counts"]["confirmed"] == 12 and doc["retries"]["waiting"] == 0
    rows = sheet_rows(s.target)
    assert len(rows) == 12 == len({row[1] for row in rows})  # zero duplicates
    assert run_main("status", "--db", s.db).returncode == 0


def test_the_slow_fault_slows_every_call_and_changes_nothing_else(
    cli_store: CliStore,
) -> None:
    s = cli_store
    s.accept(1, 2)
    out = s.once("--fault", "slow")
    assert out.returncode == 0 and last_json(out.stdout)["confirmed"] == 2, out.stderr
    polled = s.run("poll-status", "--fault", "slow")
    assert polled.returncode == 0 and last_json(polled.stdout)["polled"] == 2
