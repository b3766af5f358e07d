"""The HTTP edge in real processes with real signals (issue 18 points 1, 5, 6):
``start --listen`` serves from the loop's task group and stops with it; ``serve`` runs
intake without the loop; a stop with requests in flight answers 200 only for what is
stored."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.cli import main
from tests.helpers import CANARY, Child, dump_store, event, ndjson, run_cli, store_exists
from tests.httpkit import SECRET, TOKEN, body_of, port_of, signed, wait_ready

pytestmark = pytest.mark.timeout(120)


def secret_env(workdir: Path) -> tuple[Path, dict[str, str]]:
    path = workdir / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    return path, {"RUNNER_VERIFY_TOKEN": TOKEN}


def stored(db: str) -> dict[str, Any]:
    proc = run_cli("status", "--db", db, "--records")
    assert proc.returncode == 0, proc.stderr
    return {r["source_lead_id"]: r for r in ndjson(proc.stdout)}


def post(port: int, doc: Any, client: httpx.Client | None = None) -> httpx.Response:
    body = body_of(doc)
    return (client or httpx).post(f"http://127.0.0.1:{port}/webhook", content=body,
                                  headers=signed(body), timeout=30)


def test_start_listen_serves_from_the_loop_and_stops_with_it(
        workdir: Path, scope_file: Path, db_location: str) -> None:
    secret, env = secret_env(workdir)
    child = Child("start", "--db", db_location, "--scope", scope_file,
                  "--target", workdir / "target.db", "--interval", "0.2",
                  "--listen", "127.0.0.1:0", "--webhook-secret-file", secret, env=env)
    try:
        port = port_of(child)
        ready = wait_ready(port, child)
        assert ready.pop("replication")["mode"] in ("single_file", "single")
        assert ready == {"ready": True, "mode": "start", "lock": True, "store": True,
                         "stopping": False, "reconnecting": False,
                         "require_synchronous": False}
        answer = post(port, event(1, contact_alias=CANARY))
        assert answer.status_code == 200 and answer.json()["result"] == "accepted"
        # the loop delivers what the webhook accepted
        child.wait_for(lambda c: any(json.loads(line)["confirmed"] for line in c.out),
                       what="a cycle that confirms")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
    assert stored(db_location)["lead-1"]["state"] == "confirmed"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    output = "\n".join(child.out + child.err)
    assert CANARY not in output and SECRET.decode() not in output


def test_serve_runs_intake_without_the_lock_beside_a_worker(
        workdir: Path, scope_file: Path, db_location: str) -> None:
    secret, env = secret_env(workdir)
    worker = Child("start", "--db", db_location, "--scope", scope_file,
                   "--target", workdir / "target.db", "--interval", "0.2")
    serve = None
    try:
        worker.wait_out_lines(1)
        serve = Child("serve", "--db", db_location, "--scope", scope_file,
                      "--listen", "127.0.0.1:0", "--webhook-secret-file", secret,
                      "--log-format", "json", env=env)
        port = port_of(serve)
        assert wait_ready(port, serve)["lock"] is None
        assert post(port, event(7)).status_code == 200
        worker.wait_for(lambda c: any(json.loads(line)["confirmed"] for line in c.out),
                        what="the worker confirming the served record")
        serve.signal(signal.SIGINT)
        assert serve.finish() == 0, serve.err
        worker.signal(signal.SIGTERM)
        assert worker.finish() == 0, worker.err
    finally:
        worker.kill()
        if serve is not None:
            serve.kill()
    assert stored(db_location)["lead-7"]["state"] == "confirmed"


def test_a_stop_with_requests_in_flight_answers_200_only_for_stored_records(
        workdir: Path, scope_file: Path, db_location: str) -> None:
    secret, env = secret_env(workdir)
    child = Child("serve", "--db", db_location, "--scope", scope_file,
                  "--listen", "127.0.0.1:0", "--webhook-secret-file", secret, env=env)
    answered: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    try:
        port = port_of(child)
        wait_ready(port, child)

        def load(worker: int) -> None:
            with httpx.Client() as client:
                i = 0
                while not stop.is_set():
                    key = f"{worker}-{i}"
                    try:
                        code = post(port, event(key), client).status_code
                    except httpx.TransportError:
                        return  # the server closed: no answer, no promise
                    with lock:
                        answered[f"lead-{key}"] = code
                    i += 1

        threads = [threading.Thread(target=load, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        child.wait_for(lambda _c: len(answered) >= 50, what="50 answers")
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        stop.set()
        child.kill()
    records = stored(db_location)
    ok = {key for key, code in answered.items() if code == 200}
    assert ok and ok <= set(records)  # every 200 is stored
    assert {code for code in answered.values()} <= {200, 503}


@pytest.mark.parametrize("extra", [
    ["--listen", "0.0.0.0:0"],
    ["--listen", "0.0.0.0:0", "--listen-public"],
    ["--listen", "127.0.0.1:99999"],
    ["--listen", "127.0.0.1:0", "--webhook-secret-file", "/nonexistent/secret"],
])
def test_a_refused_listener_exits_2_and_touches_nothing(
        workdir: Path, scope_file: Path, missing_location: str, extra: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--db", missing_location, "--scope", str(scope_file), *extra])
    assert code == 2
    assert not store_exists(missing_location)
    err = capsys.readouterr().err
    assert "error" in err and len(err.strip().splitlines()) == 1
    code = main(["start", "--db", missing_location, "--scope", str(scope_file), "--target",
                 str(workdir / "t.db"), *extra])
    assert code == 2
    assert not store_exists(missing_location)
    assert dump_store(missing_location) is not None
