"""Staged processing (SPEC part P): durable levels D1-D4, versioned processors, batch
claims under leases, workers and jobs, and the built-in lead funnel.

::

    model.py     stages, levels, processor identity, outcomes, claims (pure data)
    port.py      PipelineStore: the domain operations a Store implements
    engine.py    processors, the registry, one claim-process-complete round
    stages/      one module per stage: raw ingestion, core processing, generic
                 materialization, domain projection
    funnel.py    the built-in lead funnel processors (D1 -> D2 -> D3 -> D4)
    hotconfig.py the raw retriever's hot-reloaded configuration file
    workers.py   the worker API: continuous workers
    jobs.py      the job API: finite jobs (backfill, replays), with progress
    report.py    backlog and the status blocks

At-least-once processing + idempotent durable persistence + durable outcomes (P5): a
batch may be processed twice (its worker died after processing, before completing), and
writing it twice changes nothing.
"""
