"""The HTTP target over real loopback HTTP against a real ``runner target-serve`` process
(issue 17): every classification rule on the wire, the readback contract, the token, and
``once``/``start --target http://…`` delivering, reconciling and polling as the SQLite
target does.  The pure rules, case by case: tests/test_http_target_rules.py."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from runner.errors import TargetUnavailable
from runner.io.targets.http import HttpTarget, Timeouts
from runner.leads.models import CRMRecord
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RateLimited,
    RejectedWrite,
    Snapshot,
)
from tests.helpers import CANARY, Child, CliStore, last_json
from tests.targetkit import TargetServer, target_server

pytestmark = pytest.mark.timeout(120)

TOKEN = "synthetic-target-token-91c4"


def record(i: int) -> CRMRecord:
    return CRMRecord(tenant="tenant-synthetic-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=True, contact_alias=f"alias-{i}")


def batch(*ids: int) -> list[tuple[CRMRecord, str]]:
    return [(record(i), f"w-{i}") for i in ids]


@contextmanager
def served_target(workdir: Path, *args: str | Path, timeouts: Timeouts | None = None
                  ) -> Iterator[tuple[TargetServer, HttpTarget]]:
    """A ``runner target-serve`` child (with ``args``) and an HTTP target client on it,
    closed on the way out."""
    with target_server(workdir, *args) as server:
        target = HttpTarget(server.url, timeouts=timeouts)
        try:
            yield server, target
        finally:
            target.close()


def test_appends_read_back_exactly_and_statuses_come_back(workdir: Path) -> None:
    with served_target(workdir) as (server, target):
        target.write_batch(batch(1, 2, 3))
        target.write(record(4), "w-4")
        rows = target.read_back_many(["w-1", "w-4", "w-none"])
        assert [(r.write_id, dict(r.fields)) for r in rows] == [
            ("w-1", record(1).model_dump()), ("w-4", record(4).model_dump())]
        assert target.read_back("w-none") == []
        seen = target.observe_status(["w-2", "w-none"])
        assert seen["w-2"] == Snapshot({"status": "new"})
        assert seen["w-none"].kind == "missing"
        again = HttpTarget(server.url + "/")
        try:
            assert target.target_id() == again.target_id()
        finally:
            again.close()
        assert [w for w, _ in server.rows()] == ["w-1", "w-2", "w-3", "w-4"]


def test_connection_refused_is_not_sent(workdir: Path) -> None:
    with served_target(workdir, "--fault", "refuse") as (_server, target):
        with pytest.raises(BeforeWriteError) as caught:
            target.write_batch(batch(1))
        assert type(caught.value) is BeforeWriteError
        assert "ConnectError" in caught.value.message
        with pytest.raises(TargetUnavailable):
            target.target_id()


def test_429_from_the_quota_is_rate_limited_and_applies_nothing(workdir: Path) -> None:
    with served_target(workdir, "--quota", "1/min") as (server, target):
        target.write_batch(batch(1, 2))
        target.write_batch(batch(3))  # the bucket holds two requests
        with pytest.raises(RateLimited) as caught:
            target.write_batch(batch(4, 5))
        assert caught.value.retry_after is not None and caught.value.retry_after >= 1
        # reads are not counted against the append quota
        assert len(target.read_back_many(["w-1", "w-3", "w-4"])) == 2
        assert [w for w, _ in server.rows()] == ["w-1", "w-2", "w-3"]


def test_503_with_retry_after_is_rate_limited(workdir: Path) -> None:
    with served_target(workdir, "--fault", "unavailable") as (server, target):
        with pytest.raises(RateLimited) as caught:
            target.write_batch(batch(1))
        assert caught.value.retry_after == 1.0
        assert server.rows() == []


def test_400_and_422_are_rejected_with_the_servers_reason(workdir: Path) -> None:
    with served_target(workdir, "--fault", "reject") as (server, target):
        with pytest.raises(RejectedWrite) as caught:
            target.write_batch(batch(1))
        assert "rejected" in caught.value.message
        assert server.rows() == []
    # the server's own validation, on the wire: an invalid row and a body not JSON
    with target_server(workdir, store=workdir / "other.db") as server:
        from runner.io.targets.protocol import classify_append

        bad = httpx.post(f"{server.url}/append", json={"rows": [
            {"write_id": "w-1", "fields": {**record(1).model_dump(), "tenant": 7}}]})
        assert bad.status_code == 422
        error = classify_append(bad.status_code, bad.headers, bad.content, 1, _now())
        assert isinstance(error, RejectedWrite) and "tenant" in error.message
        garbage = httpx.post(f"{server.url}/append", content=b"{not json")
        assert garbage.status_code == 400
        assert isinstance(classify_append(400, garbage.headers, garbage.content, 1, _now()),
                           RejectedWrite)
        assert server.rows() == []


def _now():
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_500_is_uncertain_even_when_nothing_was_applied(workdir: Path) -> None:
    with served_target(workdir, "--fault", "error-before") as (_server, target):
        with pytest.raises(AmbiguousWriteError):
            target.write_batch(batch(1))
        assert target.read_back("w-1") == []  # readback is what tells


def test_apply_then_drop_is_uncertain_and_readback_finds_the_rows(workdir: Path) -> None:
    with served_target(workdir, "--fault", "drop-after-apply") as (_server, target):
        with pytest.raises(AmbiguousWriteError) as caught:
            target.write_batch(batch(1, 2))
        assert "RemoteProtocolError" in caught.value.message
        assert [r.write_id for r in target.read_back_many(["w-1", "w-2"])] == ["w-1", "w-2"]


def test_a_read_timeout_after_the_server_applied_is_uncertain(workdir: Path) -> None:
    with served_target(workdir, "--fault", "slow-after-apply:60", "--grace", "0",
                       timeouts=Timeouts(read=0.5)) as (_, target):
        with pytest.raises(AmbiguousWriteError) as caught:
            target.write_batch(batch(1))
        assert "ReadTimeout" in caught.value.message
        assert [r.write_id for r in target.read_back_many(["w-1"])] == ["w-1"]


def test_the_bearer_token_is_required_and_never_echoed(workdir: Path) -> None:
    token_file = workdir / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with target_server(workdir, "--token-file", token_file) as server:
        anonymous = HttpTarget(server.url)
        wrong = HttpTarget(server.url, token=b"wrong-token")
        right = HttpTarget(server.url, token=TOKEN.encode())
        try:
            for target in (anonymous, wrong):
                with pytest.raises(BeforeWriteError) as caught:
                    target.write_batch(batch(1))
                assert "401" in caught.value.message
                with pytest.raises(TargetUnavailable):
                    target.target_id()
            right.write_batch(batch(1))
            assert TOKEN not in repr(right)
        finally:
            for target in (anonymous, wrong, right):
                target.close()
        assert [w for w, _ in server.rows()] == ["w-1"]
    assert TOKEN not in "\n".join(server.child.out + server.child.err)


def _target(cli_store: CliStore, url: str) -> None:
    cli_store.target = url  # type: ignore[assignment]


def test_once_delivers_reconciles_a_dropped_batch_and_polls(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.accept(1, 2, 3)
    with target_server(workdir, "--fault", "drop-after-apply") as server:
        _target(cli_store, server.url)
        first = cli_store.cli("once")
        assert (first["dispatched"], first["uncertain"], first["confirmed"]) == (3, 3, 0)
        second = cli_store.cli("once")
        assert (second["reconciled"], second["polled"], second["poll_failed"]) == (3, 3, 0)
        records = cli_store.records()
        assert {r["state"] for r in records.values()} == {"confirmed"}
        # exactly one row per record on the server: reconciled, never resent
        ids = sorted(r["write_id"] for r in records.values())
        assert sorted(w for w, _ in server.rows()) == ids


def test_once_leaves_a_rejected_batch_failed_safe_and_a_refusing_target_changes_nothing(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.accept(1, 2)
    with target_server(workdir, "--fault", "reject") as server:
        _target(cli_store, server.url)
        proc = cli_store.once("--retry-base", "0")  # due again at once, not after a backoff
        summary = last_json(proc.stdout)
        assert (summary["dispatched"], summary["failed_safe"]) == (2, 2)
        assert "target.rejected" in proc.stderr and "fault reject" in proc.stderr
        assert server.rows() == []
    assert {r["state"] for r in cli_store.records().values()} == {"failed_safe"}
    # the same target again, now healthy: the failed-safe records are sent (once)
    with target_server(workdir) as server:
        _target(cli_store, server.url)
        assert cli_store.cli("once")["confirmed"] == 2
        assert len(server.rows()) == 2
    # nothing listening: the check before work stops the run; no record changes
    with target_server(workdir, "--fault", "refuse") as server:
        _target(cli_store, server.url)
        proc = cli_store.once()
        assert proc.returncode != 0 and "cannot be reached" in proc.stderr
    assert {r["state"] for r in cli_store.records().values()} == {"confirmed"}


def test_status_shows_the_servers_reason_for_a_rejected_write_until_the_next_send(
        cli_store: CliStore, workdir: Path) -> None:
    cli_store.accept(1, 2, 3)
    with target_server(workdir, "--fault", "reject") as server:
        _target(cli_store, server.url)
        # --retry-base 0: due again at once (the test waits for no backoff)
        assert cli_store.cli("once", "--batch-size", "2", "--retry-base", "0")[
            "failed_safe"] == 3
    doc = cli_store.status()
    assert doc["retries"]["rejected"] == 3 and doc["counts"]["failed_safe"] == 3
    reasons = {r["source_lead_id"]: r["last_error"] for r in cli_store.all_records()}
    # the server's own words, per record (two requests: each record its request's reason)
    assert set(reasons) == {"lead-1", "lead-2", "lead-3"}
    assert all(reason is not None and "422" in reason and "fault reject" in reason
               for reason in reasons.values()), reasons
    # no personal data: the reason is the server's, never the record's fields
    assert not any("alias" in reason for reason in reasons.values())
    # the next state change clears it: a healthy target confirms the records
    with target_server(workdir) as server:
        _target(cli_store, server.url)
        assert cli_store.cli("once")["confirmed"] == 3
    doc = cli_store.status()
    assert doc["retries"]["rejected"] == 0
    assert [r["last_error"] for r in cli_store.all_records()] == [None] * 3


def test_start_with_an_http_target_delivers_reconciles_and_polls(
        cli_store: CliStore, workdir: Path) -> None:
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    cli_store.accept(*range(1, 13))
    with target_server(workdir, "--token-file", token_file, "--fault", "drop-after-apply@0.5",
                       "--fault-seed", "3") as server:
        child = Child("start", "--db", cli_store.db, "--scope", cli_store.scope,
                      "--target", server.url, "--target-token-file", token_file,
                      "--batch-size", "3", "--interval", "0.05")
        try:
            def done(c: Child) -> bool:
                lines = [json.loads(line) for line in c.out if line.startswith("{")]
                return any(s["still_uncertain"] == 0 and s["polled"] for s in lines) and \
                    sum(s["confirmed"] + s["reconciled"] for s in lines) >= 12
            child.wait_for(done, 60, "every record confirmed and polled")
            child.signal(signal.SIGTERM)
            assert child.finish() == 0, child.err
        finally:
            child.kill()
        summaries = [json.loads(line) for line in child.out]
        assert sum(s["uncertain"] for s in summaries) > 0  # some batches were dropped
        assert sum(s["reconciled"] for s in summaries) > 0
        records = cli_store.records()
        assert {r["state"] for r in records.values()} == {"confirmed"}
        assert sorted(w for w, _ in server.rows()) == sorted(
            r["write_id"] for r in records.values())
        output = "\n".join(child.out + child.err)
        assert TOKEN not in output and CANARY not in output
    assert last_json(child.out[-1])["still_uncertain"] == 0


def test_target_serve_refuses_a_public_address_without_a_token(workdir: Path) -> None:
    from tests.helpers import run_main

    proc = run_main("target-serve", "--listen", "0.0.0.0:0", "--store", workdir / "s.db")
    assert proc.returncode == 2 and "token is required" in proc.stderr
    assert not (workdir / "s.db").exists()


def test_a_token_file_for_a_file_target_is_refused(cli_store: CliStore) -> None:
    cli_store.accept(1)
    proc = cli_store.once("--target-token-file", "/nonexistent")
    assert proc.returncode == 2 and "http(s)" in proc.stderr
