"""Backlog and the pipeline blocks of ``status`` (SPEC P3, P10, P11).

The backlog is counted per stage and per ``processor@version`` at the current version of
each processor: the processors this process knows in code (the built-in funnel and any
plugins) and every processor a worker or job recorded in the store, whichever version is
higher.  Raw ingestion's backlog is the outbox events of the tailed kinds after the
retriever's cursor.  Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner.pipeline.model import STAGES, ProcessorRef, Stage, WorkerConfigView
from runner.pipeline.stages import raw_ingestion

if TYPE_CHECKING:
    from runner.pipeline.port import PipelineStore


def current_refs(known: Sequence[ProcessorRef], stored: Sequence[ProcessorRef]
                 ) -> list[ProcessorRef]:
    """The highest version of every processor, from code and from the store."""
    best: dict[str, ProcessorRef] = {}
    for ref in [*stored, *known]:
        if ref.name not in best or ref.version > best[ref.name].version:
            best[ref.name] = ref
    return sorted(best.values(), key=lambda r: (STAGES.index(r.stage), r.name))


def _tailed_kinds(configs: Sequence[WorkerConfigView]) -> tuple[str, ...]:
    for view in configs:
        if view.worker == raw_ingestion.WORKER and isinstance(view.effective, dict):
            kinds = view.effective.get("kinds")
            if isinstance(kinds, list) and all(isinstance(k, str) for k in kinds):
                return tuple(kinds)
    return raw_ingestion.LEAD_KINDS


async def backlog_document(store: PipelineStore, known: Sequence[ProcessorRef]
                           ) -> dict[str, Any]:
    """``{"pending_total": n, "stages": {stage: {"processor@version": pending}}}``."""
    refs = current_refs(known, await store.registered_processors())
    counts = await store.backlog(refs)
    stages: dict[str, dict[str, int]] = {stage.value: {} for stage in STAGES}
    kinds = _tailed_kinds(await store.worker_configs())
    stages[Stage.RAW_INGESTION.value][raw_ingestion.SOURCE_LABEL] = \
        await raw_ingestion.pending(store, kinds)
    for ref in refs:
        stages[ref.stage.value][ref.label] = counts[ref.label]
    total = sum(n for stage in stages.values() for n in stage.values())
    return {"pending_total": total, "stages": stages}


def _config_json(view: WorkerConfigView) -> dict[str, Any]:
    return {"desired": view.desired, "effective": view.effective, "error": view.error,
            "updated_at": view.updated_at}


async def pipeline_document(store: PipelineStore, known: Sequence[ProcessorRef]
                            ) -> dict[str, Any]:
    """The ``pipeline`` block of ``status``: backlog, level sizes, worker configs."""
    levels = await store.level_counts()
    configs = await store.worker_configs()
    return {
        "backlog": await backlog_document(store, known),
        "levels": {f"D{level}": n for level, n in sorted(levels.records.items())},
        "history": levels.history,
        "raw_cursor": await store.cursor_position(raw_ingestion.CURSOR),
        "workers": {view.worker: _config_json(view) for view in configs},
    }


def builtin_refs() -> list[ProcessorRef]:
    """The built-in funnel's processors, by identity only (not loaded: see ``builtin``)."""
    from runner.pipeline.builtin import FUNNEL_REFS

    return list(FUNNEL_REFS)
