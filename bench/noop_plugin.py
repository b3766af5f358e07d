"""The no-op processor the pipeline benchmark measures (and a ``--plugin`` for the CLI)."""

from __future__ import annotations

from runner.pipeline.engine import Registry, processor
from runner.pipeline.model import Item, Outcome, Stage, no_output


@processor("noop", version=1, stage=Stage.CORE_PROCESSING, capability="noop")
def NOOP(item: Item) -> Outcome:
    return no_output()


def register(registry: Registry) -> None:
    registry.register(NOOP)
