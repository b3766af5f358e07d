"""Failures an operator can read (issue 29 point 7): a failed batch is one log line with
its size and what happened (refused, timed out, 5xx, dropped after sending, malformed
answer); the same failure said again is rate-limited; each record keeps the reason
(``last_error``, ``last_failure``) for ``status --records`` and ``runner uncertain``; the
pinned-target refusal shows ids that differ.  Over real loopback HTTP against a real
``runner target-serve``."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

import pytest

from runner import DurableWorker
from runner.errors import TargetMismatch
from runner.logs import Repeats
from tests.helpers import SCOPE, Child, CliStore, event, last_json, run_main
from tests.targetkit import target_server

pytestmark = pytest.mark.timeout(120)


def _lines(text: str, action: str) -> list[str]:
    return [line for line in text.splitlines() if f" {action} " in f" {line} "]


@pytest.mark.parametrize(("fault", "extra", "kind"), [
    ("error-before", (), "server_error"),
    ("drop-after-apply", (), "dropped"),
    ("slow-after-apply:3", ("--target-timeout", "0.3"), "timed_out"),
])
def test_a_failed_batch_is_one_line_and_each_record_keeps_why(
        cli_store: CliStore, workdir: Path, fault: str, extra: tuple[str, ...],
        kind: str) -> None:
    for i in range(1, 6):
        cli_store.accept(i)
    with target_server(workdir, "--fault", fault) as server:
        cli_store.target = server.url  # type: ignore[assignment]
        proc = cli_store.once("--batch-size", "5", *extra)
        assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["uncertain"] == 5
    failed = [line for line in proc.stderr.splitlines() if "uncertain" in line
              and "batch.in_flight" not in line]
    assert len(failed) == 1, proc.stderr  # one line for the batch, not two per record
    assert "batch.uncertain" in failed[0] and "count=5" in failed[0]
    assert f"reason={kind}" in failed[0]
    records = cli_store.all_records()
    assert {r["last_failure"] for r in records} == {kind}
    assert all(r["last_error"] for r in records)
    listed = json.loads(run_main("uncertain", "--db", cli_store.db).stdout)["records"]
    assert {r["last_failure"] for r in listed} == {kind} and len(listed) == 5
    assert all(r["last_error"] == records[0]["last_error"] for r in listed)


def test_a_target_that_goes_down_is_said_once_a_minute_not_every_cycle(
        cli_store: CliStore, workdir: Path) -> None:
    """Three records left uncertain by a crash before their request, then the server gone
    for many cycles: the failing readback and the refused sends are each said once (and
    again at most once a minute, saying how many were left out), not once per cycle; the
    records say why they wait."""
    for i in range(1, 4):
        cli_store.accept(i)
    started = time.monotonic()
    with target_server(workdir) as server:
        cli_store.target = server.url  # type: ignore[assignment]
        crashed = cli_store.once("--batch-size", "3", "--fault", "crash-before-write")
        assert crashed.returncode == 73, crashed.stderr
        child = Child("start", "--db", cli_store.db, "--scope", cli_store.scope,
                      "--target", server.url, "--interval", "0.05", "--retry-base", "0.05",
                      "--retry-cap", "0.1")
        try:
            child.wait_for(lambda c: any('"recovered":3' in line for line in c.out), 30,
                           "the crashed batch recovered")
            server.child.signal(signal.SIGTERM)
            assert server.child.finish() == 0
            for i in range(4, 6):  # accepted while the target is down: refused, retried
                cli_store.accept(i)
            child.wait_for(lambda c: sum('"failed_safe":2' in line for line in c.out) >= 10,
                           60, "ten cycles refused by a target that is down")
            child.signal(signal.SIGTERM)
            assert child.finish() == 0, child.err
        finally:
            child.kill()
    minutes = math.ceil((time.monotonic() - started) / 60)
    err = "\n".join(child.err)
    reads = _lines(err, "lead.reconcile_failed")
    refused = [line for line in child.err if "failed_safe" in line and "reason=refused" in line]
    assert 1 <= len(reads) <= minutes + 1, err
    assert 1 <= len(refused) <= minutes + 1, err
    assert "count=3" in reads[0]
    states = {r["source_lead_id"]: (r["state"], r["last_failure"])
              for r in cli_store.all_records()}
    assert states == {"lead-1": ("uncertain", "recovered"),
                      "lead-2": ("uncertain", "recovered"),
                      "lead-3": ("uncertain", "recovered"),
                      "lead-4": ("failed_safe", "refused"),
                      "lead-5": ("failed_safe", "refused")}


def test_repeats_are_said_once_a_window_with_how_many_were_left_out() -> None:
    now = [0.0]
    repeats = Repeats(window=60, monotonic=lambda: now[0])
    assert repeats.admit("a") == 0
    assert repeats.admit("b") == 0  # another failure is news
    now[0] = 30
    assert repeats.admit("a") is None and repeats.admit("a") is None
    now[0] = 61
    assert repeats.admit("a") == 2  # two left out since
    repeats.forget("a")  # recovered: the next one is news again
    assert repeats.admit("a") == 0


class Named:
    """A target of no rows whose identity is given."""

    def __init__(self, target_id: str) -> None:
        self.id = target_id

    def target_id(self) -> str:
        return self.id

    def write(self, record: object, write_id: str) -> None:
        raise AssertionError("never written")

    def read_back(self, write_id: str) -> list[object]:
        return []

    def observe_status(self, write_ids: list[str]) -> dict[str, object]:
        return {}


async def test_the_pinned_target_refusal_shows_two_ids_that_differ(db_location: str) -> None:
    pinned, other = "runner-target-000000000001", "runner-target-000000000002"
    async with DurableWorker(db_location, SCOPE, Named(pinned)) as worker:
        await worker.accept(event(1))
        await worker.check_target()
    async with DurableWorker(db_location, SCOPE, Named(other)) as worker:
        with pytest.raises(TargetMismatch) as refused:
            await worker.check_target()
    message = refused.value.message
    assert "runner-target-000000000001" in message and "runner-target-000000000002" in message
