"""A failed step's outcomes that committed all the same are counted by the cycle.

On PostgreSQL a dispatch run's step records one request's outcomes on a session of the
run's own and marks the next batch on the store's (``runner.io.postgres.delivery``).
When the mark fails (the worker lock's session ended: the fence refuses it; or the store's
own session ended) the outcomes have committed beside it.  The store holds them either
way; these tests check that the cycle's summary, which a ride-through prints for a cycle
cut short, says so too (it said 0 confirmed), and that nothing is recorded twice.  The
sessions are ended with ``pg_terminate_backend`` during the first batch's request."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from runner import DurableWorker
from runner.errors import ConnectionLost, LockLost
from runner.io.synthetic_target import SyntheticTarget
from runner.leads.models import CRMRecord
from runner.tasks.outcomes import CycleSummary
from tests import pg
from tests.fakes import sheet_rows
from tests.helpers import SCOPE, event

pytestmark = pytest.mark.timeout(60)


class EndsASession(SyntheticTarget):
    """The synthetic target; its first batch write ends a session of the worker's
    (``end``), after the rows are in: the batch is written, and its outcomes are recorded
    by the step that fails."""

    def __init__(self, path: Path, end: Callable[[], None]) -> None:
        super().__init__(str(path))
        self._end, self._ended = end, threading.Event()

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]], **kw: Any) -> None:
        super().write_batch(items, **kw)
        if not self._ended.is_set():
            self._ended.set()
            self._end()


def lock_session() -> int:
    """The backend of this process that holds the worker lock (an advisory lock)."""
    rows = pg.fetch(
        "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE $1",
        f"runner pid={os.getpid()} %")
    assert len(rows) == 1, rows
    return int(rows[0][0])


def terminate(pid: int) -> None:
    pg.execute("SELECT pg_terminate_backend($1)", pid)


async def states(worker: DurableWorker) -> dict[str, str]:
    return {r.source_lead_id: r.state.value async for r in worker.store.iter_records()}


async def run_until_lost(tmp_path: Path, db: str, which: str
                         ) -> tuple[CycleSummary, BaseException, dict[str, str], Path]:
    async with DurableWorker(db, SCOPE, None) as filler:
        for i in range(4):
            assert (await filler.accept(event(i))).ok
    worker_box: dict[str, DurableWorker] = {}

    def end() -> None:
        store: Any = worker_box["w"].store
        terminate(lock_session() if which == "lock" else store._conn.get_server_pid())

    target_path = tmp_path / "t.db"
    target = EndsASession(target_path, end)
    summary = CycleSummary()
    async with DurableWorker(db, SCOPE, target, dispatch_pipeline=False) as worker:
        worker_box["w"] = worker
        with pytest.raises((LockLost, ConnectionLost)) as raised:
            await worker.run_cycle(summary=summary, batch_size=2)
    target.close()
    async with DurableWorker(db, SCOPE, None) as reader:
        found = await states(reader)
    return summary, raised.value, found, target_path


@pytest.mark.parametrize(("which", "lost"), [("lock", LockLost), ("store", ConnectionLost)],
                         ids=["a mark refused by the fence", "a mark on a lost session"])
async def test_the_outcomes_committed_beside_a_failed_mark_are_counted(
        tmp_path: Path, pg_db: str, which: str, lost: type[Exception]) -> None:
    summary, error, found, target = await run_until_lost(tmp_path, pg_db, which)
    assert isinstance(error, lost)
    assert found == {"lead-0": "confirmed", "lead-1": "confirmed",
                     "lead-2": "prepared", "lead-3": "prepared"}
    assert (summary.dispatched, summary.confirmed) == (2, 2)
    assert [r[4] for r in sheet_rows(target)] == ["lead-0", "lead-1"]
