"""The private cluster fixture (tests/pgcluster.py) does what its tests rely on: it
starts on a private port, survives every way of stopping it with its committed data, and
leaves nothing behind (no file, no process) when torn down."""

from __future__ import annotations

import pytest

from tests.pgcluster import _alive, _children, make_cluster, require

pytestmark = pytest.mark.timeout(120)


def test_a_private_cluster_stops_every_way_starts_again_and_tears_down_completely() -> None:
    require()
    cluster = make_cluster()
    try:
        assert cluster.port != 5432
        cluster.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
        for stop in ("smart", "fast", "immediate", "kill9"):
            pid = cluster.postmaster_pid()
            assert pid is not None
            if stop == "kill9":
                cluster.kill9()
            else:
                cluster.stop(stop)  # type: ignore[arg-type]
            assert not cluster.is_running() and not _alive(pid)
            cluster.start()
            assert cluster.postmaster_pid() not in (None, pid)
            cluster.execute("INSERT INTO kept VALUES (2)")
        assert cluster.fetch("SELECT count(*) FROM kept") == [(5,)]
        pid = cluster.postmaster_pid()
        assert pid is not None
        backends = _children(pid)
        assert backends  # the checkpointer, the writers …
    finally:
        cluster.destroy()
    assert not cluster.root.exists()
    assert not any(_alive(p) for p in [pid, *backends])
