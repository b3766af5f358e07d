"""/healthz and /readyz (issue 18 point 4): the pure rules, then a real process whose loop
is stuck in a send (stale, then healthy again) and that is stopping (not ready, intake
503 with Retry-After)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from runner.io.http.health import LoopState, liveness, readiness
from tests.helpers import Child, event, wait_path
from tests.httpkit import SECRET, body_of, port_of, signed, wait_ready

pytestmark = pytest.mark.timeout(120)


def test_liveness_counts_intervals_from_the_start_then_from_the_last_cycle() -> None:
    state = LoopState(mode="start", started_at=100.0, interval=5.0, intervals=3)
    assert liveness(state, 114.0)[0] is True
    ok, body = liveness(state, 116.0)
    assert ok is False and body["status"] == "stale" and body["cycles"] == 0
    state.cycle_done(120.0, 1.7e9)
    assert liveness(state, 130.0)[0] is True
    assert liveness(state, 135.5)[0] is False


def test_liveness_counts_at_least_a_second_per_interval() -> None:
    state = LoopState(mode="start", started_at=0.0, interval=0.0, intervals=2)
    assert liveness(state, 1.9)[0] is True and liveness(state, 2.1)[0] is False


def test_serve_is_live_without_cycles() -> None:
    state = LoopState(mode="serve", started_at=0.0)
    assert liveness(state, 1e6) == (True, {"status": "ok", "mode": "serve"})


@pytest.mark.parametrize(("mode", "lock", "store_ok", "stopping", "ready"), [
    ("start", True, True, False, True),
    ("start", False, True, False, False),
    ("start", True, False, False, False),
    ("start", True, True, True, False),
    ("serve", False, True, False, True),
    ("serve", False, True, True, False),
])
def test_readiness(mode: str, lock: bool, store_ok: bool, stopping: bool,
                   ready: bool) -> None:
    state = LoopState(mode=mode, started_at=0.0, lock_held=lock,  # type: ignore[arg-type]
                      stop_asked=stopping)
    assert readiness(state, store_ok)[0] is ready


def test_a_stuck_loop_is_stale_and_a_stopping_one_is_not_ready(
        workdir: Path, scope_file: Path, db_location: str) -> None:
    secret = workdir / "secret"
    secret.write_bytes(SECRET)
    hang = workdir / "hang"
    hang.mkdir()
    child = Child("start", "--db", db_location, "--scope", scope_file,
                  "--target", workdir / "target.db", "--interval", "0.2",
                  "--health-intervals", "1", "--fault", "hang", "--grace", "60",
                  "--listen", "127.0.0.1:0", "--webhook-secret-file", secret,
                  env={"RUNNER_HANG_DIR": str(hang)})
    base = ""
    try:
        port = port_of(child)
        base = f"http://127.0.0.1:{port}"
        wait_ready(port, child)
        body = body_of(event(1))
        assert httpx.post(f"{base}/webhook", content=body, headers=signed(body)
                          ).status_code == 200
        wait_path(hang / "entered-write", child)  # the next cycle's send is stuck
        child.wait_for(lambda _c: httpx.get(f"{base}/healthz").status_code == 503,
                       what="a stale /healthz")
        stale = httpx.get(f"{base}/healthz").json()
        assert stale["status"] == "stale" and stale["seconds_since_cycle"] > 1

        child.signal(signal.SIGTERM)  # graceful: the send in flight may finish
        child.wait_err("letting the send in flight finish")
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 503
        doc = ready.json()
        assert doc.pop("replication")["mode"] in ("single_file", "single")
        assert doc == {"ready": False, "mode": "start", "lock": True, "store": True,
                       "stopping": True, "reconnecting": False, "require_synchronous": False}
        refused = httpx.post(f"{base}/webhook", content=body_of(event(2)),
                             headers=signed(body_of(event(2))))
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
        (hang / "release").touch()
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    lines = [json.loads(line) for line in child.out]
    assert sum(line["confirmed"] for line in lines) == 1
