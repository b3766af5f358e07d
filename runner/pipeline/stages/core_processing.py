"""Core processing (SPEC P1, P2): D1 raw inputs -> D2 core outputs.

Its processors read one raw input each (for the lead funnel, one outbox event) and
normalise it: the built-in ``lead-facts`` mapper turns a lead event into a lead fact.
A new mapper version re-backlogs every D1 input unless it declares otherwise.

Work is shared by batch claims under leases (P4): ``run_cycle`` is one
claim-process-complete round of each processor registered for this stage, and the
``core-processor`` worker and the ``replay-core`` job both run it.
"""

from __future__ import annotations

from runner.clock import Clock
from runner.pipeline.engine import Registry, RoundResult, WorkerSettings, claim_cycle
from runner.pipeline.model import Stage
from runner.pipeline.port import PipelineStore

STAGE = Stage.CORE_PROCESSING
WORKER = "core-processor"
JOB = "replay-core"


async def run_cycle(store: PipelineStore, registry: Registry, owner: str,
                    settings: WorkerSettings, clock: Clock) -> RoundResult:
    return await claim_cycle(STAGE, store, registry, owner, settings, clock)
