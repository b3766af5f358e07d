"""The reliability harness shared by the tests and the benchmarks: an outside auditor of a
runner store and its target (``invariants``), which trusts none of runner's code."""
