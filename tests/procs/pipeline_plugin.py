"""A ``--plugin`` for pipeline child processes in tests.

``RUNNER_TEST_HANG_FILE``: the built-in ``lead-facts@1`` is replaced by one that, once it
holds a batch, creates that file (the test's signal that the batch is claimed) and then
hangs until the process is killed.  Without it, the built-ins run unchanged.
``RUNNER_TEST_NOOP``: adds ``noop@1``, a core processor that records ``no_output``.
``RUNNER_TEST_SLOW_SECONDS``: ``lead-facts@1`` takes that long for each batch (so a test
can lose the store while batches are in hand).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import anyio

from runner.pipeline.engine import Registry, processor
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.model import Item, Outcome, Stage, no_output


class HangingLeadFacts(LeadFacts):
    def __init__(self, marker: str) -> None:
        self.marker = marker

    async def process(self, items: Sequence[Item]) -> Sequence[Outcome]:
        # written whole, then renamed: the test waits for the file, then reads it
        partial = anyio.Path(self.marker + ".partial")
        await partial.write_text(",".join(str(i.input_id) for i in items))
        await partial.rename(self.marker)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class SlowLeadFacts(LeadFacts):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def process(self, items: Sequence[Item]) -> Sequence[Outcome]:
        await anyio.sleep(self.seconds)
        return await super().process(items)


@processor("noop", version=1, stage=Stage.CORE_PROCESSING, capability="noop")
def noop(item: Item) -> Outcome:
    return no_output()


def register(registry: Registry) -> None:
    marker = os.environ.get("RUNNER_TEST_HANG_FILE")
    if marker:
        registry.register(HangingLeadFacts(marker))
    slow = os.environ.get("RUNNER_TEST_SLOW_SECONDS")
    if slow:
        registry.register(SlowLeadFacts(float(slow)))
    if os.environ.get("RUNNER_TEST_NOOP"):
        registry.register(noop)
