"""runner's benchmarks (``python -m bench``, or ``python bench/run.py``) and reliability
harnesses (``bench/chaos.py``, ``bench/kill9.py``); the store auditor they and the tests
share is ``harness/invariants.py``."""
