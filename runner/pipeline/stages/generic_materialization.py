"""Generic materialization (SPEC P1, P2): D2 core outputs -> D3 materializations.

Its processors fold core outputs into current rows; the built-in ``lead-current``
materializer keeps one current row per lead, merged field by field by outbox sequence, so
facts may land in any order and landing twice changes nothing.

Work is shared by batch claims under leases (P4): ``run_cycle`` is one
claim-process-complete round of each processor registered for this stage, and the
``generic-materializer`` worker and the ``replay-generic-materialization`` job both run it.
"""

from __future__ import annotations

from runner.clock import Clock
from runner.pipeline.engine import Registry, RoundResult, WorkerSettings, claim_cycle
from runner.pipeline.model import Stage
from runner.pipeline.port import PipelineStore

STAGE = Stage.GENERIC_MATERIALIZATION
WORKER = "generic-materializer"
JOB = "replay-generic-materialization"


async def run_cycle(store: PipelineStore, registry: Registry, owner: str,
                    settings: WorkerSettings, clock: Clock) -> RoundResult:
    return await claim_cycle(STAGE, store, registry, owner, settings, clock)
