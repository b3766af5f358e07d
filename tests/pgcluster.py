"""Private PostgreSQL clusters for the tests: ``harness.pgcluster`` (one cluster) and
``harness.pgpair`` (a primary and its standby), with the skip a test takes where none can
be made (no server tools, or root without a ``postgres`` user)::

    with private_cluster() as cluster:
        cluster.kill9()
    with private_pair(synchronous=True) as pair:
        pair.failover()

The shared server (``tests/pg.py``, 127.0.0.1:5432) is never stopped or restarted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest

from harness import pgpair
from harness.pgcluster import (
    Cluster,
    _alive,
    _children,
    attach,
    free_port,
    make_cluster,
    sessions,
    unavailable,
    wait_until,
)
from harness.pgpair import Pair

__all__ = ["Cluster", "Pair", "_alive", "_children", "attach", "free_port", "make_cluster",
           "private_cluster", "private_pair", "require", "sessions", "wait_until"]


def require() -> None:
    """Skip the test when no private cluster can be made."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


@contextlib.contextmanager
def private_cluster(settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A running private cluster for the ``with`` block, then gone (skips the test when
    none can be made here)."""
    require()
    cluster = make_cluster(settings)
    try:
        yield cluster
    finally:
        cluster.destroy()


@contextlib.contextmanager
def private_pair(*, synchronous: bool) -> Iterator[Pair]:
    """A running primary and its streaming standby (``harness.pgpair``) for the ``with``
    block, then gone, whatever the block did (skips the test when none can be made)."""
    require()
    with pgpair.private_pair(synchronous=synchronous) as pair:
        yield pair
