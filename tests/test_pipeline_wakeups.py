"""Wake-ups on PostgreSQL (issue 7 point 6; SPEC P9): LISTEN/NOTIFY wakes a consumer when
its stage gets new input; every consumer also polls, so a lost notification loses
nothing; a dead listener is detected and reconnected."""

from __future__ import annotations

import anyio
import pytest

from runner.clock import SystemClock
from runner.io.stores import open_store
from runner.leads.models import Scope
from runner.pipeline.engine import WorkerSettings
from runner.pipeline.model import NewRecord, Stage
from runner.pipeline.plugins import default_registry
from runner.pipeline.workers import WorkerCycle, run_worker
from runner.store import Store
from tests import pg
from tests.pipeline_fixtures import level

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def postgres_only(backend: str) -> None:
    if backend != "postgres":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite consumers poll")


def _event(i: int) -> NewRecord:
    return NewRecord(f"outbox:{i}", {"seq": i, "kind": "accepted", "lead": f"lead-{i}",
                                     "tenant_id": "tenant-1", "form_id": "form-1",
                                     "at": "2026-11-30T12:00:00.000000Z",
                                     "data": {"state": "prepared"}})


async def _consume_until(store: Store, writer_location: str, poll: float, n: int) -> int:
    """Run a core-processor whose first cycle finds nothing, then write ``n`` D1 inputs
    through ``writer_location``; returns how many notifications the consumer heard."""
    idle, got = anyio.Event(), anyio.Event()
    processed = 0

    def emit(cycle: WorkerCycle) -> None:
        nonlocal processed
        processed += cycle.result.claimed
        if cycle.result.claimed == 0:
            idle.set()
        if processed >= n:
            got.set()

    heard: list[int] = []
    original = store.wakeups

    def spying(stage: Stage):  # record the listener the worker uses
        cm = original(stage)

        class Spy:
            async def __aenter__(self):
                self.wake = await cm.__aenter__()
                heard.append(0)
                return self.wake

            async def __aexit__(self, *exc):
                heard[-1] = self.wake.heard
                return await cm.__aexit__(*exc)

        return Spy()

    store.wakeups = spying  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_worker(
            store, "core-processor", registry=default_registry(), clock=SystemClock(),
            settings=WorkerSettings(poll_interval=poll), emit=emit))
        with anyio.fail_after(20):
            await idle.wait()
        async with await open_store(writer_location) as writer:
            await writer.ingest([_event(i) for i in range(1, n + 1)], ("test", 1),
                                None, None, 0)
        with anyio.fail_after(20):
            await got.wait()
        tg.cancel_scope.cancel()
    assert len(await level(store, 2)) == n
    return heard[-1]


async def test_a_notification_wakes_an_idle_consumer_long_before_its_poll(
    postgres_only: None, store: Store, db_location: str
) -> None:
    heard = await _consume_until(store, db_location, poll=300, n=5)  # never polls again
    assert heard >= 1


async def test_with_notifications_off_polling_still_processes_everything(
    postgres_only: None, store: Store, db_location: str
) -> None:
    quiet = db_location + "&runner.pipeline_notify=off"
    heard = await _consume_until(store, quiet, poll=0.2, n=5)
    assert heard == 0  # nothing was notified, nothing was lost


async def test_a_dead_listener_is_detected_and_reconnected(
    postgres_only: None, store: Store, scope: Scope, db_location: str
) -> None:
    async with store.wakeups(Stage.CORE_PROCESSING) as wake:
        first = wake.backend_pid  # type: ignore[attr-defined]
        assert first is not None
        pg.execute("SELECT pg_terminate_backend($1)", first)
        with anyio.fail_after(20):
            await wake.wait(60)  # the termination wakes it; it reconnects
        assert wake.reconnects == 1  # type: ignore[attr-defined]
        assert wake.backend_pid not in (None, first)  # type: ignore[attr-defined]
        async with await open_store(db_location) as writer:
            await writer.ingest([_event(1)], ("test", 1), None, None, 0)
        with anyio.fail_after(20):
            await wake.wait(60)  # woken by the notification on the new session
        assert wake.heard >= 1  # type: ignore[attr-defined]
