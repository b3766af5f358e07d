"""One module per pipeline stage (SPEC P1).  Each depends on the ``PipelineStore``
protocol, never on an adapter; workers and jobs share the same stage code."""
