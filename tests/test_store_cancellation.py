"""A transaction or snapshot whose caller is cancelled while it begins leaves the
connection usable: the BEGIN that was already on its way is ended, never left open for
the next caller (found by a pipeline worker whose lease-renewal task was cancelled at
that moment)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from runner.store import Store

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["transaction", "reading"])
async def test_a_begin_cut_off_by_a_cancellation_leaves_the_connection_usable(
        store: Store, kind: str) -> None:
    for steps in range(24):
        with anyio.CancelScope() as scope:

            async def cancel_after(n: int) -> None:
                for _ in range(n):
                    await anyio.lowlevel.checkpoint()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_after, steps % 6)
                opened = store.transaction() if kind == "transaction" else store.reading()
                async with opened:
                    await store.fetch("lead_counts")  # type: ignore[attr-defined]
        # whatever the moment, the next transaction and snapshot work
        with anyio.fail_after(30):
            async with store.transaction():  # type: ignore[attr-defined]
                await store.fetch("lead_counts")  # type: ignore[attr-defined]
            async with store.reading():
                await store.fetch("lead_counts")  # type: ignore[attr-defined]
