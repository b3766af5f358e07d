"""Domain projection (SPEC P1, P2): D3 materializations -> D4 domain projections.

Its processors project current rows onto a domain; the built-in ``lead-funnel``
projector gives each confirmed lead one funnel entry (its form and latest observed
status), which ``status`` counts.  A changed D3 row is projected again.

Work is shared by batch claims under leases (P4): ``run_cycle`` is one
claim-process-complete round of each processor registered for this stage, and the
``domain-projector`` worker and the ``replay-domain-projection`` job both run it.
"""

from __future__ import annotations

from runner.clock import Clock
from runner.pipeline.engine import Registry, RoundResult, WorkerSettings, claim_cycle
from runner.pipeline.model import Stage
from runner.pipeline.port import PipelineStore

STAGE = Stage.DOMAIN_PROJECTION
WORKER = "domain-projector"
JOB = "replay-domain-projection"


async def run_cycle(store: PipelineStore, registry: Registry, owner: str,
                    settings: WorkerSettings, clock: Clock) -> RoundResult:
    return await claim_cycle(STAGE, store, registry, owner, settings, clock)
