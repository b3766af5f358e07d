"""Pacing, backoff and the batched reconcile pass (issue 16 points 3 and 4).

The pacer (a token bucket) and the backoff are driven by injected clocks, never by wall
time; dispatch and reconcile run through the library on both backends; the CLI as a user
runs it (``--now`` replaces the clock across separate runs); and a real ``start`` process
against a target that answers "rate limited" delivers everything exactly once.
"""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.clock import to_text
from runner.errors import UsageError
from runner.ids import WriteId
from runner.leads.models import CRMRecord, LeadEvent
from runner.leads.pacing import Backoff, Pacer, parse_duration, parse_rate
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    CRMRecordPort,
    RateLimited,
    TargetRow,
)
from runner.leads.states import LeadState
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, Child, CliStore, event, last_json, run_main, worker_records

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class StepClock:
    """The store's wall clock, moved by the test."""

    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


class FakeTime:
    """The pacer's monotonic clock; its sleeps move it (no test waits for real)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def pacer(self, rate: float | None, burst: int = 1) -> Pacer:
        return Pacer(rate, burst=burst, monotonic=self.monotonic, sleep=self.sleep,
                     async_sleep=self.async_sleep)


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


# -- the pacer in dispatch and reconcile --------------------------------------------------


class Timed(ScriptedAdapter):
    """A batching sheet that notes the pacer's time of every request; ``answers`` says
    what each batch write does in turn (``ok``, ``rate_limited``, ``timeout``: written,
    then the answer is lost)."""

    def __init__(self, path: Path, clock: FakeTime, answers: Sequence[str] = ()) -> None:
        super().__init__(path)
        self.clock = clock
        self.answers = list(answers)
        self.requests: list[tuple[str, float, int]] = []  # (kind, time, rows)

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        self.requests.append(("write", self.clock.t, len(items)))
        answer = self.answers.pop(0) if self.answers else "ok"
        if answer == "rate_limited":
            raise RateLimited("quota", retry_after=30.0)
        self.sheet.write_batch(items)
        if answer == "timeout":
            raise AmbiguousWriteError("written, then timed out")

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self.requests.append(("read", self.clock.t, len(write_ids)))
        return self.sheet.read_back_many(write_ids)


async def test_dispatch_keeps_the_quota_and_honours_retry_after(
    db_location: str, workdir: Path
) -> None:
    fake, clock = FakeTime(), StepClock()
    adapter = Timed(workdir / "t.db", fake, ["rate_limited"])
    one = fake.pacer(rate=1.0)  # 60 requests a minute, reads and writes in one bucket
    port = CRMRecordPort(adapter, one, one)
    async with DurableWorker(db_location, SCOPE, port, clock=clock, batch_size=2) as worker:
        for i in range(6):
            await worker.accept(event(i))
        first = await worker.run_cycle()
        recs = {r["source_lead_id"]: r for r in await worker_records(worker)}
        assert (first.failed_safe, first.confirmed) == (2, 4)
        assert (await worker.status())["retries"]["next_attempt_at"] == to_text(
            T0 + timedelta(seconds=30))  # the target's retry_after, not the exponential
        clock.at = T0 + timedelta(seconds=30)
        second = await worker.run_cycle()
    assert second.confirmed == 2
    times = [t for _, t, _ in adapter.requests]
    # every request a token: never two within a second (60/min), writes and reads alike
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))
    # nothing at all before retry_after had passed
    assert adapter.requests[0][0] == "write" and times[1] - times[0] >= 30.0
    assert recs["lead-0"]["state"] == "failed_safe" and recs["lead-2"]["state"] == "confirmed"
    rows = sheet_rows(workdir / "t.db")
    assert len(rows) == 6 == len({row[1] for row in rows})  # each write_id once


async def test_reconcile_reads_many_records_per_request_with_verdicts_of_their_own(
    db_location: str, workdir: Path
) -> None:
    fake = FakeTime()
    adapter = Timed(workdir / "t.db", fake, ["timeout"] * 3)
    port = CRMRecordPort(adapter, fake.pacer(rate=None))
    async with DurableWorker(db_location, SCOPE, port, batch_size=4) as worker:
        ids = [(await worker.accept(event(i))).write_id for i in range(10)]
        first = await worker.run_cycle()  # 3 requests written, answers lost: uncertain
        assert first.uncertain == 10
        # behind runner's back: one row deleted, one changed
        sheet = sqlite3.connect(workdir / "t.db")
        try:
            sheet.execute("DELETE FROM sheet WHERE write_id = ?", (ids[1],))
            sheet.execute("UPDATE sheet SET contact_alias = 'x' WHERE write_id = ?",
                          (ids[2],))
            sheet.commit()
        finally:
            sheet.close()
        adapter.requests.clear()
        second = await worker.run_cycle()
        status = await worker.status()
        records = await worker_records(worker)
    reads = [rows for kind, _, rows in adapter.requests if kind == "read"]
    assert reads == [4, 4, 2]  # 10 records, 3 requests (was: 10)
    assert second.reconciled == 8 and status["counts"]["uncertain"] == 2
    recs = {r["write_id"]: r for r in records}
    assert recs[ids[1]]["state"] == recs[ids[2]]["state"] == "uncertain"
    assert all(recs[w]["state"] == "confirmed" for w in ids if w not in ids[1:3])
    assert all(r["reconcile_attempts"] == 1 for r in recs.values())


async def test_a_reconcile_pass_reads_the_oldest_attempt_first(db_location: str) -> None:
    async with DurableWorker(db_location, SCOPE) as worker:
        ids = [WriteId(str((await worker.accept(event(i))).write_id)) for i in range(4)]
        store = worker.store
        await store.finish_and_mark_batch([], ids, T0)
        await store.finish_and_mark_batch([(w, LeadState.UNCERTAIN) for w in ids], [], T0)
        seqs = await store.reconcile_order()
        assert len(seqs) == 4  # never read back: accept order
        # lead-2 read back at 12:01, lead-0 at 12:02: lead-1 and lead-3 never
        await store.record_reconcile_batch([(ids[2], "none", None)], T0 + timedelta(minutes=1))
        await store.record_reconcile_batch([(ids[0], "none", None)], T0 + timedelta(minutes=2))
        order = await store.reconcile_order()
        work = await store.uncertain_by_seqs(order)
    assert [w.write_id for w in work] == [ids[1], ids[3], ids[2], ids[0]]


async def test_poll_reads_take_tokens_too(db_location: str, workdir: Path) -> None:
    fake = FakeTime()
    adapter = Timed(workdir / "t.db", fake)
    one = fake.pacer(rate=0.5)  # one request every 2 s, reads and writes alike
    port = CRMRecordPort(adapter, one, one)
    async with DurableWorker(db_location, SCOPE, port, batch_size=10) as worker:
        for i in range(3):
            await worker.accept(event(i))
        await worker.run_cycle()  # a write and its readback: 2 tokens
        before = fake.t
        await worker.poll(10)  # a status read: one more
    assert fake.t - before == 2.0 and port.pacer.taken == 3


# -- separate read and write quotas ----------------------------------------------------


def _gaps(times: Sequence[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


async def test_reads_are_not_paced_by_the_write_quota(
    db_location: str, workdir: Path
) -> None:
    fake = FakeTime()
    adapter = Timed(workdir / "t.db", fake)
    port = CRMRecordPort(adapter, fake.pacer(rate=1.0))  # 60 writes a minute, reads free
    async with DurableWorker(db_location, SCOPE, port, batch_size=2) as worker:
        for i in range(6):
            await worker.accept(event(i))
        summary = await worker.run_cycle()
    assert summary.confirmed == 6
    writes = [t for kind, t, _ in adapter.requests if kind == "write"]
    reads = [t for kind, t, _ in adapter.requests if kind == "read"]
    assert _gaps(writes) == [1.0, 1.0]  # a write a second: the quota, not two requests
    assert reads == writes  # each readback at once after its write: no token to wait for
    assert port.pacer.taken == 3 and port.read_pacer.taken == 3
    assert len(sheet_rows(workdir / "t.db")) == 6


async def test_reads_keep_a_quota_of_their_own(db_location: str, workdir: Path) -> None:
    fake = FakeTime()
    adapter = Timed(workdir / "t.db", fake)
    # 60 writes a minute, 20 reads a minute: the reads bound the pace
    port = CRMRecordPort(adapter, fake.pacer(rate=1.0), fake.pacer(rate=1 / 3))
    async with DurableWorker(db_location, SCOPE, port, batch_size=2) as worker:
        for i in range(6):
            await worker.accept(event(i))
        await worker.run_cycle()
        before = fake.t
        await worker.poll(10)  # a status read: a read token, 3 s after the last read
    reads = [t for kind, t, _ in adapter.requests if kind == "read"]
    assert _gaps(reads) == [3.0, 3.0] and fake.t - before == 3.0
    assert port.pacer.taken == 3 and port.read_pacer.taken == 4


class Refusing:
    """A target answering every request "rate limited, come back in 30 s"."""

    def _refuse(self, *_args: object) -> list[TargetRow]:
        raise RateLimited("quota", retry_after=30.0)

    write = write_batch = read_back = read_back_many = observe_status = _refuse


@pytest.mark.parametrize("refused", ["write", "read"])
async def test_a_rate_limited_answer_holds_reads_and_writes(refused: str) -> None:
    fake = FakeTime()
    port = CRMRecordPort(Refusing(), fake.pacer(rate=1.0), fake.pacer(rate=None))
    if refused == "write":
        results = port.send_batch_blocking([(LeadEvent.model_validate(event(i)), f"w-{i}")
                                           for i in (1, 2)])
        assert [r.verdict for r in results] == ["not_sent"] * 2
        assert results[0].retry_after == 30.0
    else:
        with pytest.raises(RateLimited):
            await port.read_back_many(["w-1"])
    # every later request waits: the writes' and the (unpaced) reads' alike
    assert port.pacer.reserve() == 30.0 and port.read_pacer.reserve() == 30.0
    fake.t += 30.0
    assert port.read_pacer.reserve() == 0.0  # reads free again; writes keep their quota


def test_durable_worker_sets_the_read_quota_apart() -> None:
    adapter = ScriptedAdapter.__new__(ScriptedAdapter)
    worker = DurableWorker("unused.db", SCOPE, adapter, target_rate=1.0,
                           target_read_rate=0.5)
    assert (worker.port.pacer.rate, worker.port.read_pacer.rate) == (1.0, 0.5)
    unpaced = DurableWorker("unused.db", SCOPE, adapter, target_rate=1.0)
    assert (unpaced.port.pacer.rate, unpaced.port.read_pacer.rate) == (1.0, None)


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
