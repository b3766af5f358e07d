"""A log line's time (``runner.logs.stamp``) reuses the text of its second: it must
read exactly as the datetime it stands for, at every fraction and across seconds."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from runner.logs import stamp


def _long_way(created: float, digits: int) -> str:
    text = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return text[: len(text) - 6 + digits] + "Z"


@pytest.mark.parametrize("digits", [3, 6])
def test_stamp_reads_as_the_datetime(digits: int) -> None:
    rng = random.Random(16)
    times = [rng.uniform(1.7e9, 1.9e9) for _ in range(20_000)]
    # runs within one second and over its edges, the order a busy log writes them in
    times += [1_764_547_199.0 + i * 0.0000371 for i in range(60_000)]
    times += [1_764_547_199.9999996, 1_764_547_199.9999994, 1_764_547_200.0, 0.0]
    for created in times:
        assert stamp(created, digits) == _long_way(created, digits), created


def test_stamp_shape() -> None:
    assert stamp(1_764_547_200.25) == "2025-12-01T00:00:00.250Z"
    assert stamp(1_764_547_200.25, 6) == "2025-12-01T00:00:00.250000Z"
