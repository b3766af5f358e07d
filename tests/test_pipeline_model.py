"""The pure parts of the pipeline (SPEC P2, P5): outcomes, the field merge of current
rows (order-independent and idempotent), retry decisions, hot configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.pipeline.engine import RetryPolicy, completions
from runner.pipeline.funnel import LeadFacts
from runner.pipeline.hotconfig import HotConfig, RetrieverConfig
from runner.pipeline.model import (
    Claim,
    Item,
    Outcome,
    Output,
    failed,
    merge_fields,
    no_output,
    output,
)

facts = st.lists(
    st.tuples(st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), min_size=1),
              st.integers(0, 1000)),
    max_size=8, unique_by=lambda f: f[1])  # one fact per outbox sequence


def _fold(items: list[tuple[dict[str, int], int]]) -> tuple[dict, dict]:
    payload, orders = None, None
    for incoming, order in items:
        payload, orders = merge_fields(payload, orders, incoming, order)
    return payload or {}, orders or {}


@given(facts, st.randoms())
def test_a_current_row_does_not_depend_on_the_order_facts_land_in(items, rnd) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert _fold(items) == _fold(shuffled)


@given(facts)
def test_landing_twice_changes_nothing(items) -> None:
    assert _fold(items + items) == _fold(items)


def test_outcomes_check_their_shape() -> None:
    with pytest.raises(ValueError, match="outputs"):
        Outcome("no_output", (Output("k", {}),))
    with pytest.raises(ValueError, match="at least one"):
        Outcome("output")
    with pytest.raises(ValueError, match="error"):
        Outcome("failed")
    assert failed("x" * 900, retryable=True).error == "x" * 500


def _claim(attempts: list[int]) -> Claim:
    items = tuple(Item(i, i, f"k{i}", {}, 1, a) for i, a in enumerate(attempts))
    return Claim(LeadFacts.ref, "me", 7, items, 0)


def test_a_retryable_failure_backs_off_until_its_attempts_run_out() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_seconds=2, backoff_max_seconds=5)
    outcome = failed("boom", retryable=True)
    done = completions(_claim([1, 2, 3]), [outcome] * 3, policy, 1000)
    assert [(c.state, c.available_ms) for c in done] == [
        ("pending", 3000), ("pending", 5000), ("done", 1000)]
    final = completions(_claim([1]), [failed("bad", retryable=False)], policy, 1000)
    assert final[0].state == "done"


def test_a_processor_that_miscounts_its_outcomes_fails_the_batch_for_good() -> None:
    done = completions(_claim([1, 1]), [no_output()], RetryPolicy(), 0)
    assert {(c.state, c.outcome.kind, c.outcome.retryable) for c in done} == {
        ("done", "failed", False)}
    assert output(Output("k", {"a": 1})).outputs[0].key == "k"


def test_hot_config_keeps_the_effective_configuration_when_the_file_is_bad(
    tmp_path: Path,
) -> None:
    path = tmp_path / "retriever.json"
    hot = HotConfig(str(path), RetrieverConfig(batch_size=7))
    assert hot.reload() and hot.effective.batch_size == 7 and "cannot read" in hot.error
    path.write_text(json.dumps({"batch_size": 3, "kinds": ["accepted"]}))
    assert hot.reload() and hot.error is None
    assert (hot.effective.batch_size, hot.effective.kinds) == (3, ("accepted",))
    assert not hot.reload()  # unchanged file: nothing new to show
    path.write_text(json.dumps({"batch_size": 3, "extra": 1}))
    assert hot.reload() and "extra" in hot.error and hot.effective.batch_size == 3
    assert hot.desired == {"batch_size": 3, "extra": 1}
    view = hot.view("now")
    assert view.effective == {"batch_size": 3, "kinds": ["accepted"], "poll_interval": 1.0}


def test_hot_config_reads_a_bounded_amount_and_refuses_devices(tmp_path: Path) -> None:
    import tracemalloc

    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(64 << 20)  # sparse: 64 MiB that take no disk
    hot = HotConfig(str(huge), RetrieverConfig(batch_size=7))
    tracemalloc.start()
    try:
        assert hot.reload()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # at most the document limit (1 MiB) and change was read
    assert "larger than" in (hot.error or "") and hot.effective.batch_size == 7
    device = HotConfig("/dev/zero", RetrieverConfig(batch_size=7))
    assert device.reload() and "not a regular file" in (device.error or "")
    assert device.effective.batch_size == 7
