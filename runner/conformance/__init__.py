"""The conformance kit's checks (issues 17, 29), one module per part: ``base`` (the
harness, the report, synthetic records, judging a readback), ``healthy`` (round trips,
batches and reads at runner's sizes), ``dedupe`` (the proof of ``dedupes_write_id``) and
``conditions`` (each outcome class a harness can provoke).  Use it through
:mod:`runner.testing`."""
