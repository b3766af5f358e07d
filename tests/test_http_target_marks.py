"""Batch marks over the HTTP target protocol (issue 30), over real loopback HTTP against
real ``runner target-serve --marks`` processes: the server declares ``marks_batches`` in
its identity and the adapter learns it; the kit proves the marks (with and without
``--dedupe``); a refused append answers 409 with the documented body, applies nothing,
and is StaleMark or ForeignMark to the adapter; the mark and read-by-key calls have the
documented shapes; a server without ``--marks`` is never sent a mark and answers as
before; two servers on one sheet serialise their marked appends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from runner.io.targets.http import HttpTarget
from runner.leads.marks import BatchMark, ForeignMark, StaleMark, TargetMark, marks
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, TargetReadError
from runner.testing import Harness, check_adapter
from tests.targetkit import TargetServer, target_server

pytestmark = pytest.mark.timeout(120)


def record(i: int) -> CRMRecord:
    return CRMRecord(tenant="tenant-synthetic-1", source="meta", source_lead_id=f"lead-{i}",
                     is_test=True, contact_alias=f"alias-{i}")


def batch(*ids: int) -> list[tuple[CRMRecord, str]]:
    return [(record(i), f"w-{i}") for i in ids]


def row_json(i: int) -> dict[str, object]:
    return {"write_id": f"w-{i}", "fields": record(i).fields()}


@contextmanager
def client(server: TargetServer, *, identify: bool = True) -> Iterator[HttpTarget]:
    target = HttpTarget(server.url)
    try:
        if identify:
            target.target_id()
        yield target
    finally:
        target.close()


def test_a_marks_server_declares_it_and_the_adapter_learns_it(workdir: Path) -> None:
    with target_server(workdir, "--marks") as server:
        doc = httpx.get(f"{server.url}/identity").json()
        assert doc == {"target_id": doc["target_id"], "protocol": 2, "marks_batches": True}
        with client(server, identify=False) as target:
            assert target.marks_batches is False  # not read yet: version 1 assumed
            target.target_id()
            assert marks(target) is True and target.dedupes_write_id is False
    with target_server(workdir, "--marks", "--dedupe", store=workdir / "two.db") as server:
        doc = httpx.get(f"{server.url}/identity").json()
        assert doc == {"target_id": doc["target_id"], "protocol": 2, "marks_batches": True,
                       "dedupes_write_id": True}


@pytest.mark.parametrize("args", [("--marks",), ("--marks", "--dedupe")],
                         ids=["marks", "marks and dedupe"])
def test_the_kit_proves_a_marks_server(workdir: Path, args: tuple[str, ...]) -> None:
    with target_server(workdir, *args) as server:
        report = check_adapter(Harness(healthy=lambda: HttpTarget(server.url),
                                       batch_size=50, poll_limit=50))
        report.assert_passed(require_marks=True, require_dedupe="--dedupe" in args)
        proof = [c for c in report.checks if c.name.startswith("marks:")]
        assert len(proof) == 8 and all(c.outcome == "passed" for c in proof), report.text()


def test_a_refused_append_answers_409_with_the_held_mark_and_applies_nothing(
        workdir: Path) -> None:
    with target_server(workdir, "--marks") as server:
        append = f"{server.url}/append"
        mark = {"store_id": "store-a", "seq": (7 << 32) | 3}
        first = httpx.post(append, json={"rows": [row_json(1)], "mark": mark})
        assert first.status_code == 200 and first.json() == {"appended": 1}
        assert httpx.get(f"{server.url}/mark").json() == {"owner": "store-a",
                                                          "seq": (7 << 32) | 3}
        stale = httpx.post(append, json={"rows": [row_json(2)], "mark": mark})
        assert stale.status_code == 409
        assert stale.json() == {"error": "stale_mark", "refused": "stale_mark",
                                "message": stale.json()["message"],
                                "held": {"owner": "store-a", "seq": (7 << 32) | 3}}
        foreign = httpx.post(append, json={"rows": [row_json(3)],
                                           "mark": {"store_id": "store-b", "seq": 1 << 40}})
        assert foreign.status_code == 409 and foreign.json()["refused"] == "foreign_mark"
        assert [w for w, _ in server.rows()] == ["w-1"]
        # the adapter's view of the same answers
        with client(server) as target:
            with pytest.raises(StaleMark) as raised:
                target.write_batch(batch(2), mark=BatchMark("store-a", (7 << 32) | 3))
            assert raised.value.held == TargetMark("store-a", (7 << 32) | 3)
            assert isinstance(raised.value, BeforeWriteError)
            with pytest.raises(ForeignMark):
                target.write_batch(batch(2), mark=BatchMark("store-b", 1 << 40))
            with pytest.raises(ForeignMark):
                target.raise_mark(BatchMark("store-b", 1 << 40))
            assert [w for w, _ in server.rows()] == ["w-1"]
            # an unmarked append (a client that does not mark) applies, mark untouched
            assert target.write_batch(batch(4)) is None
            assert target.read_mark() == TargetMark("store-a", (7 << 32) | 3)
            assert [w for w, _ in server.rows()] == ["w-1", "w-4"]


def test_the_mark_and_read_keys_calls_have_the_documented_shapes(workdir: Path) -> None:
    with target_server(workdir, "--marks") as server:
        url = server.url
        assert httpx.get(f"{url}/mark").json() == {"owner": None, "seq": 0}
        raised = httpx.post(f"{url}/mark", json={"mark": {"store_id": "a", "seq": 5},
                                                 "replaces": None})
        assert raised.status_code == 200 and raised.json() == {
            "owner": "a", "seq": 5, "replaced": {"owner": None, "seq": 0}}
        again = httpx.post(f"{url}/mark", json={"mark": {"store_id": "a", "seq": 5}})
        assert again.status_code == 409 and again.json()["refused"] == "stale_mark"
        moved = httpx.post(f"{url}/mark", json={"mark": {"store_id": "b", "seq": 1},
                                                "replaces": "a"})
        assert moved.json() == {"owner": "b", "seq": 1, "replaced": {"owner": "a", "seq": 5}}
        for bad in ({"store_id": "", "seq": 1}, {"store_id": "b", "seq": -1},
                    {"store_id": "b", "seq": True}, {"store_id": "b", "seq": 1 << 63},
                    {"store_id": "b"}, "b"):
            answer = httpx.post(f"{url}/append", json={"rows": [row_json(1)], "mark": bad})
            assert answer.status_code == 422, bad
            assert answer.json()["error"] == "invalid_mark"
        assert server.rows() == []
        httpx.post(f"{url}/append", json={"rows": [row_json(1)]})
        httpx.post(f"{url}/append", json={"rows": [{**row_json(1), "write_id": "w-1b"}],
                                          "mark": {"store_id": "b", "seq": 2}})
        found = httpx.post(f"{url}/read_keys", json={"keys": [
            {"tenant": "tenant-synthetic-1", "source_lead_id": "lead-1"},
            {"tenant": "tenant-synthetic-1", "source_lead_id": "lead-9"}]})
        assert found.status_code == 200
        assert [(r["write_id"], r["fields"], r["status"]) for r in found.json()["rows"]] == [
            ("w-1", record(1).fields(), "new"), ("w-1b", record(1).fields(), "new")]
        bad_key = httpx.post(f"{url}/read_keys", json={"keys": [{"tenant": "t"}]})
        assert bad_key.status_code == 422


def test_a_server_without_marks_is_never_sent_a_mark_and_answers_as_before(
        workdir: Path) -> None:
    with target_server(workdir, "--dedupe") as server:
        assert httpx.get(f"{server.url}/mark").status_code == 404
        assert httpx.post(f"{server.url}/read_keys", json={"keys": []}).status_code == 404
        # a mark in an append is an unknown top-level member to it: ignored
        answer = httpx.post(f"{server.url}/append", json={
            "rows": [row_json(1)], "mark": {"store_id": "a", "seq": 1}})
        assert answer.status_code == 200
        with client(server) as target:
            assert marks(target) is False
            with pytest.raises(BeforeWriteError, match="does not declare marks_batches"):
                target.write_batch(batch(2), mark=BatchMark("a", 2))
            with pytest.raises(BeforeWriteError):
                target.raise_mark(BatchMark("a", 2))
            with pytest.raises(TargetReadError):
                target.read_mark()
        assert [w for w, _ in server.rows()] == ["w-1"]


def test_two_marks_servers_on_one_sheet_serialise_marked_appends(workdir: Path) -> None:
    store = workdir / "shared.db"
    with target_server(workdir, "--marks", store=store) as one, \
            target_server(workdir, "--marks", store=store) as two:
        start = threading.Barrier(2, timeout=30)
        outcomes: dict[int, list[str]] = {0: [], 1: []}

        def send(i: int, server: TargetServer) -> None:
            with client(server) as target:
                start.wait()
                for n in range(30):
                    seq = 2 * n + i + 1  # interleaved: 1, 3, 5, … and 2, 4, 6, …
                    try:
                        target.write_batch([(record(seq), f"w-{seq}")],
                                           mark=BatchMark("store-a", seq))
                        outcomes[i].append("applied")
                    except StaleMark:
                        outcomes[i].append("stale")

        threads = [threading.Thread(target=send, args=(i, s), daemon=True)
                   for i, s in enumerate((one, two))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads)
        applied = [int(w[2:]) for w, _ in one.rows()]
        # the rows applied are exactly the batches answered "applied", in increasing seq
        # order (a stale one applied nothing), and the mark is the highest, which no
        # other can be newer than
        assert applied == sorted(applied)
        assert len(applied) == sum(o.count("applied") for o in outcomes.values())
        with client(one) as target:
            assert target.read_mark() == TargetMark("store-a", 60)
        assert applied[-1] == 60
