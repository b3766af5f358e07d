"""The identities of the built-in lead funnel's processors (``funnel.py`` has the code).

Kept apart so that ``status``, which counts their backlog, names them without loading
the processors or the engine.
"""

from __future__ import annotations

from runner.pipeline.model import ProcessorRef, Stage

LEAD_FACTS = ProcessorRef("lead-facts", 1, Stage.CORE_PROCESSING, "lead-event-mapper")
LEAD_CURRENT = ProcessorRef("lead-current", 1, Stage.GENERIC_MATERIALIZATION, "current-row")
LEAD_FUNNEL = ProcessorRef("lead-funnel", 1, Stage.DOMAIN_PROJECTION, "funnel-projection")

#: in the order ``funnel.processors()`` returns them
FUNNEL_REFS: tuple[ProcessorRef, ...] = (LEAD_FACTS, LEAD_CURRENT, LEAD_FUNNEL)
