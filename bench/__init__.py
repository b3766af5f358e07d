"""runner's benchmarks: ``python -m bench`` (or ``python bench/run.py``)."""
