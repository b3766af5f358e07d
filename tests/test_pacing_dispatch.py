"""The pacer in delivery (issue 16 points 3 and 4): dispatch keeps the target's quota
and honours its retry-after, the reconcile pass reads many records per request (the oldest
attempt first), poll reads take tokens too, and reads keep a quota of their own, apart
from the writes'.  Driven by the pacer's fake clock (``tests/pacingkit.py``), through the
library on both backends.  The pacer and the backoff alone, the CLI and a real process
are ``tests/test_pacing.py``'s.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.clock import to_text
from runner.ids import WriteId
from runner.leads.models import CRMRecord, LeadEvent
from runner.leads.port import AmbiguousWriteError, CRMRecordPort, RateLimited, TargetRow
from runner.leads.states import LeadState
from tests.fakes import ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, event, worker_records
from tests.pacingkit import T0, FakeTime, StepClock

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
