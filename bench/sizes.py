"""The sizes of the benchmark suite's runs: ``FULL`` for ``python -m bench`` (the figures
the documentation shows) and ``QUICK`` for ``--quick`` (CI runs it but does not judge it).

Both the suite (``bench/run.py``) and a benchmark run on its own (``python -m
bench.webhook``) take their sizes from here, so the two never disagree.
"""

from __future__ import annotations

FULL = {"single": 3000, "bulk": 100_000, "concurrent": 10_000, "dispatch": 2000,
        "sweep": 100_000, "scale": 1_000_000, "webhook": 20_000, "metrics": 1_000_000}
QUICK = {"single": 300, "bulk": 5000, "concurrent": 1000, "dispatch": 300,
         "sweep": 5000, "scale": 100_000, "webhook": 1000, "metrics": 5000}
