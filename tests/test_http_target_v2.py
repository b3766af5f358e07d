"""HTTP target protocol version 2 (issue 29) over real loopback HTTP against real
``runner target-serve`` processes: a ``--dedupe`` server declares it in its identity,
makes one row per write_id (within one append, across appends, under concurrent appends)
and answers appends with the rows it holds, which confirm a batch without a read request;
an answer whose rows are incomplete or malformed is ambiguous and read back; a server
without ``--dedupe`` still answers version 1 and runner reads back as before.  The pure
rules: tests/test_http_target_rules.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
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
    RateLimited,
    RejectedWrite,
    TargetRow,
)
from tests.helpers import ROOT, CliStore, last_json, run_main
from tests.targetkit import TargetServer, target_server

pytestmark = pytest.mark.timeout(120)


def record(i: int) -> CRMRecord:
    return CRMRecord(tenant="tenant-synthetic-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=True, contact_alias=f"alias-{i}")


def batch(*ids: int) -> list[tuple[CRMRecord, str]]:
    return [(record(i), f"w-{i}") for i in ids]


@contextmanager
def client(server: TargetServer, *, identify: bool = True,
           timeouts: Timeouts | None = None) -> Iterator[HttpTarget]:
    """An HTTP target on ``server`` that has read the server's identity (as runner does
    before any work), closed on the way out."""
    target = HttpTarget(server.url, timeouts=timeouts)
    try:
        if identify:
            target.target_id()
        yield target
    finally:
        target.close()


_STOPPED_READS = re.compile(r"stopped: .*, (\d+) reads")


def served_reads(server: TargetServer) -> int:
    """The read requests a stopped server answered (its "stopped:" line)."""
    found = [int(m.group(1)) for line in server.child.err
             if (m := _STOPPED_READS.search(line))]
    assert found, server.child.err
    return found[-1]


def ids(rows: object) -> list[str]:
    assert isinstance(rows, list) and all(isinstance(r, TargetRow) for r in rows)
    return sorted(r.write_id for r in rows)


def test_a_dedupe_server_declares_version_2_and_the_adapter_learns_it(workdir: Path) -> None:
    with target_server(workdir, "--dedupe") as server:
        doc = httpx.get(f"{server.url}/identity").json()
        assert doc == {"target_id": doc["target_id"], "protocol": 2,
                       "dedupes_write_id": True}
        with client(server, identify=False) as target:
            assert target.dedupes_write_id is False  # not read yet: version 1 assumed
            assert target.write_batch(batch(1)) is None  # not taken as rows yet
            assert target.target_id() == doc["target_id"]
            assert target.dedupes_write_id is True
            assert ids(target.write_batch(batch(2))) == ["w-2"]


def test_a_server_without_dedupe_answers_version_1_exactly_and_duplicates(
        workdir: Path) -> None:
    with target_server(workdir) as server:
        doc = httpx.get(f"{server.url}/identity").json()
        assert doc == {"target_id": doc["target_id"], "protocol": 1}
        with client(server) as target:
            assert target.dedupes_write_id is False
            assert target.write_batch(batch(1, 1, 2)) is None
            assert target.write_batch(batch(2, 3)) is None
        # like a spreadsheet: every row appended is a row
        assert [w for w, _ in server.rows()] == ["w-1", "w-1", "w-2", "w-2", "w-3"]


def test_a_dedupe_server_makes_one_row_per_write_id_within_and_across_appends(
        workdir: Path) -> None:
    with target_server(workdir, "--dedupe") as server, client(server) as target:
        first = target.write_batch(batch(1, 1, 2))
        assert ids(first) == ["w-1", "w-2"]
        assert [w for w, _ in server.rows()] == ["w-1", "w-2"]
        # a repeat shows its one existing row, exactly as stored
        second = target.write_batch(batch(2, 3))
        assert ids(second) == ["w-2", "w-3"]
        assert second is not None and all(
            dict(r.fields) == record(int(r.write_id[2:])).fields() and r.status == "new"
            for r in second)
        assert target.write_batch(batch(3)) is not None
        assert [w for w, _ in server.rows()] == ["w-1", "w-2", "w-3"]


def test_concurrent_appends_to_two_dedupe_servers_on_one_sheet_make_one_row_each(
        workdir: Path) -> None:
    store = workdir / "shared.db"
    wanted = list(range(120))
    with target_server(workdir, "--dedupe", store=store) as one, \
            target_server(workdir, "--dedupe", store=store) as two:
        start = threading.Barrier(4)
        errors: list[BaseException] = []

        def append(server: TargetServer, order: list[int]) -> None:
            try:
                with client(server) as target:
                    start.wait()
                    for at in range(0, len(order), 10):
                        rows = target.write_batch(batch(*order[at : at + 10]))
                        assert ids(rows) == sorted(f"w-{i}" for i in set(order[at : at + 10]))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=append, args=(server, order)) for server, order in
                   ((one, wanted), (two, wanted), (one, wanted[::-1]), (two, wanted[::-1]))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        assert not errors, errors
        written = [w for w, _ in one.rows()]
        assert sorted(written) == sorted(f"w-{i}" for i in wanted)
        assert len(written) == len(set(written))


def _once(cli_store: CliStore, url: str, *extra: str) -> dict[str, int]:
    cli_store.target = url  # type: ignore[assignment]
    proc = cli_store.once(*extra)
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, int] = last_json(proc.stdout)
    return summary


@pytest.mark.parametrize("dedupe", [True, False], ids=["v2-dedupe", "v1"])
def test_once_confirms_from_the_append_answer_without_a_read_only_on_version_2(
        cli_store: CliStore, workdir: Path, dedupe: bool) -> None:
    cli_store.accept(*range(1, 6))
    with target_server(workdir, *(["--dedupe"] if dedupe else [])) as server:
        summary = _once(cli_store, server.url)
        assert (summary["dispatched"], summary["confirmed"], summary["uncertain"]) == (5, 5, 0)
    # version 2: the append's answer proved the batch; version 1: one read request did
    assert served_reads(server) == (0 if dedupe else 1)
    assert {r["state"] for r in cli_store.records().values()} == {"confirmed"}


@pytest.mark.parametrize("size", ["1", "2"], ids=["one-per-request", "batches"])
@pytest.mark.parametrize("dedupe", [True, False], ids=["v2-dedupe", "v1"])
def test_with_every_read_failing_only_a_version_2_send_confirms(
        cli_store: CliStore, workdir: Path, dedupe: bool, size: str) -> None:
    cli_store.accept(*range(1, 5))
    args = ["--fault", "read-error", *(["--dedupe"] if dedupe else [])]
    with target_server(workdir, *args) as server:
        summary = _once(cli_store, server.url, "--batch-size", size)
        assert summary["dispatched"] == 4
        assert (summary["confirmed"], summary["uncertain"]) == ((4, 0) if dedupe else (0, 4))
        assert len(server.rows()) == 4


@pytest.mark.parametrize("fault", ["rows-incomplete", "rows-malformed"])
def test_an_incomplete_or_malformed_rows_answer_is_ambiguous_and_read_back(
        cli_store: CliStore, workdir: Path, fault: str) -> None:
    cli_store.accept(*range(1, 5))
    store = workdir / "sheet.db"
    with target_server(workdir, "--dedupe", "--fault", fault, store=store) as server:
        with client(server) as target, pytest.raises(AmbiguousWriteError) as caught:
            target.write_batch(batch(90, 91))
        assert "rows" in caught.value.message
        summary = _once(cli_store, server.url)
        assert (summary["dispatched"], summary["confirmed"], summary["uncertain"]) == (4, 0, 4)
    assert served_reads(server) == 0
    # the same sheet, answering properly: the batch is reconciled by readback, not resent
    with target_server(workdir, "--dedupe", store=store) as server:
        summary = _once(cli_store, server.url)
        assert (summary["reconciled"], summary["dispatched"]) == (4, 0)
        assert len(server.rows()) == 6
    assert served_reads(server) == 1
    assert {r["state"] for r in cli_store.records().values()} == {"confirmed"}


@pytest.mark.parametrize(("fault", "raised"), [
    ("throttle", RateLimited), ("unavailable", RateLimited), ("reject", RejectedWrite),
    ("error-before", AmbiguousWriteError),
])
def test_faults_before_applying_apply_nothing_on_a_dedupe_server(
        workdir: Path, fault: str, raised: type[Exception]) -> None:
    with target_server(workdir, "--dedupe", "--fault", fault) as server, \
            client(server) as target:
        with pytest.raises(raised):
            target.write_batch(batch(1, 2))
        assert server.rows() == []


def test_an_answer_lost_after_applying_on_a_dedupe_server_then_a_repeat_adds_no_row(
        workdir: Path) -> None:
    store = workdir / "sheet.db"
    for fault in ("drop-after-apply", "slow-after-apply:30"):
        with target_server(workdir, "--dedupe", "--fault", fault, "--grace", "0",
                           store=store) as server, \
                client(server, timeouts=Timeouts(read=0.5)) as target:
            with pytest.raises(AmbiguousWriteError):
                target.write_batch(batch(1, 2))
            assert [w for w, _ in server.rows()] == ["w-1", "w-2"]
    with target_server(workdir, "--dedupe", store=store) as server, client(server) as target:
        # sent again (what E7 allows a deduplicating target): the rows it holds, no new one
        assert ids(target.write_batch(batch(1, 2))) == ["w-1", "w-2"]
        assert [w for w, _ in server.rows()] == ["w-1", "w-2"]


@pytest.mark.parametrize("dedupe", [True, False], ids=["v2-dedupe", "v1"])
def test_a_server_ignores_unknown_members_of_a_request_but_not_of_a_row(
        workdir: Path, dedupe: bool) -> None:
    row = {"write_id": "w-1", "fields": record(1).fields()}
    later = {"store": {"id": "store-1"}, "batch_seq": 7}  # what a later version may add
    with target_server(workdir, *(["--dedupe"] if dedupe else [])) as server:
        appended = httpx.post(f"{server.url}/append", json={"rows": [row], **later})
        assert appended.status_code == 200 and appended.json()["appended"] == 1
        assert ("rows" in appended.json()) is dedupe
        read = httpx.post(f"{server.url}/read", json={"write_ids": ["w-1"], **later})
        assert read.status_code == 200 and len(read.json()["rows"]) == 1
        status = httpx.post(f"{server.url}/status", json={"write_ids": ["w-1"], **later})
        assert status.json() == {"statuses": {"w-1": ["new"]}}
        # a row's shape is exact: an unknown member there is refused, nothing applied
        odd = httpx.post(f"{server.url}/append", json={"rows": [{**row, "write_id": "w-2",
                                                                 "extra": 1}]})
        assert odd.status_code == 422
        assert [w for w, _ in server.rows()] == ["w-1"]


def test_the_rows_faults_need_a_dedupe_server(workdir: Path) -> None:
    proc = run_main("target-serve", "--listen", "127.0.0.1:0", "--store", workdir / "s.db",
                    "--fault", "rows-incomplete")
    assert proc.returncode == 2 and "--dedupe" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@contextmanager
def identity_server(body: str) -> Iterator[str]:
    """tests/procs/identity_server.py answering ``body`` to ``GET …/identity``: the base
    URL.  Stopped with SIGTERM on the way out."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/procs/identity_server.py"),
                             body], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the server listens
        port = int(line.split("listening on port ")[1])
        yield f"http://127.0.0.1:{port}/sheet"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        finally:
            proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.mark.parametrize(("declared", "said"), [
    ('"yes"', "dedupes_write_id"), ("1", "dedupes_write_id"), ("null", "dedupes_write_id"),
])
def test_a_malformed_dedupe_declaration_is_one_clear_error_and_changes_nothing(
        cli_store: CliStore, declared: str, said: str) -> None:
    cli_store.accept(1, 2)
    body = f'{{"target_id": "t-1", "protocol": 2, "dedupes_write_id": {declared}}}'
    with identity_server(body) as url:
        target = HttpTarget(url)
        try:
            with pytest.raises(TargetUnavailable) as caught:
                target.target_id()
            assert said in caught.value.message and target.dedupes_write_id is False
        finally:
            target.close()
        cli_store.target = url  # type: ignore[assignment]
        proc = cli_store.once()
    assert proc.returncode == TargetUnavailable.exit_code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in proc.stderr
    assert {r["state"] for r in cli_store.records().values()} == {"prepared"}


@pytest.mark.parametrize("dedupe", [True, False], ids=["v2-dedupe", "v1"])
def test_a_batch_lost_in_a_crash_is_sent_again_by_itself_only_to_a_dedupe_server(
        cli_store: CliStore, workdir: Path, dedupe: bool) -> None:
    """SPEC E7 over HTTP: the crash leaves the batch in flight with no row at the target;
    the next run reads it back and finds no row.  As a --dedupe server declared that it
    deduplicates, runner sends it again itself (no operator command), confirmed from the
    append's answer, one row per record; a version-1 server's records stay uncertain."""
    cli_store.accept(*range(1, 5))
    with target_server(workdir, *(["--dedupe"] if dedupe else [])) as server:
        cli_store.target = server.url  # type: ignore[assignment]
        crashed = cli_store.once("--fault", "crash-before-write")
        assert crashed.returncode == 73, crashed.stderr
        assert server.rows() == []
        summary = _once(cli_store, server.url, "--retry-base", "0")
        assert summary["recovered"] == 4
        records = cli_store.records()
        if not dedupe:
            assert (summary["requeued"], summary["still_uncertain"]) == (0, 4)
            assert server.rows() == []
            return
        assert (summary["requeued"], summary["confirmed"]) == (4, 4)
        assert {r["state"] for r in records.values()} == {"confirmed"}
        assert sorted(w for w, _ in server.rows()) == sorted(
            r["write_id"] for r in records.values())
    assert served_reads(server) == 1  # the reconcile's readback; the resend read nothing
