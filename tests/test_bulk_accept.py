"""Bulk and concurrent accept (issue 9 point 3): one answer per record, in order, each
after its commit, exactly the answers single accepts would give."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner import DurableWorker
from runner.jsonio import MAX_DOCUMENT_BYTES
from runner.store import Store
from tests import pg
from tests.helpers import SCOPE, Child, dump_store, event, run_main


def strip_ids(results: list[dict]) -> list[tuple]:
    return [(r["result"], r["source_lead_id"], r.get("reason")) for r in results]


async def single_answers(db: str, docs: list[object]) -> list[dict]:
    async with DurableWorker(db, SCOPE) as worker:
        return [(await worker.accept(d)).to_json() for d in docs]  # type: ignore[arg-type]


variant = st.sampled_from(["ok", "ok", "ok", "changed", "bad_type", "out_of_scope"])


#: examples per backend: a PostgreSQL example pays for two schemas of its own
EXAMPLES = {"sqlite": 40, "postgres": 8}


def test_bulk_answers_equal_single_answers(backend: str) -> None:
    @settings(max_examples=EXAMPLES[backend], deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.integers(0, 6), variant), min_size=1, max_size=40))
    def check(plan: list[tuple[int, str]]) -> None:
        _bulk_equals_single(backend, plan)

    check()


def _bulk_equals_single(backend: str, plan: list[tuple[int, str]]) -> None:
    docs: list[dict] = []
    for key, kind in plan:
        doc = event(key)
        if kind == "changed":
            doc["contact_alias"] = "changed"
        elif kind == "bad_type":
            doc["synthetic"] = "true"
        elif kind == "out_of_scope":
            doc["page_id"] = "elsewhere"
        docs.append(doc)
    schemas = [pg.new_schema(), pg.new_schema()]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o700)
        single_db, bulk_db = (
            [str(work / "single.db"), str(work / "bulk.db")] if backend == "sqlite"
            else [pg.location(name) for name in schemas])
        try:
            expected = anyio.run(single_answers, single_db, docs)

            async def bulk() -> list[dict]:
                async with DurableWorker(bulk_db, SCOPE) as worker:
                    return [r.to_json() for r in await worker.accept_many(docs)]

            got = anyio.run(bulk)
        finally:
            if backend == "postgres":
                pg.drop_later(schemas)
    assert strip_ids(got) == strip_ids(expected)
    first_id: dict[str, str] = {}
    for r in got:  # a duplicate answers with the write_id of the first accept
        if r["result"] == "accepted":
            first_id[r["source_lead_id"]] = r["write_id"]
        elif r["result"] == "duplicate":
            assert r["write_id"] == first_id[r["source_lead_id"]]


def test_records_file_answers_in_order(workdir: Path, scope_file: Path, db_location: str) -> None:
    db = db_location
    lines = [json.dumps(event(1)), "", "not json", json.dumps(event(2)), json.dumps(event(1)),
             json.dumps(event(1, contact_alias="other")), '"x"', json.dumps(event(3))]
    records = workdir / "in.ndjson"
    records.write_text("\n".join(lines) + "\n")
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--records", records)
    assert proc.returncode == 65
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert strip_ids(got) == [
        ("accepted", "lead-1", None), ("rejected", None, "invalid_json"),
        ("accepted", "lead-2", None), ("duplicate", "lead-1", None),
        ("rejected", "lead-1", "conflict"), ("rejected", None, "not_an_object"),
        ("accepted", "lead-3", None),
    ]
    assert len(proc.stderr.strip().splitlines()) == 3  # one line per rejected record
    all_ok = workdir / "ok.ndjson"
    all_ok.write_text(json.dumps(event(4)))  # no trailing newline
    again = run_main("accept", "--db", db, "--scope", scope_file, "--records", all_ok)
    assert again.returncode == 0 and json.loads(again.stdout)["result"] == "accepted"


def test_a_batch_without_rejections_answers_each_outcome(
        workdir: Path, scope_file: Path, db_location: str) -> None:
    # a batch with no rejected input has its all-accepted answers made beforehand
    # (``Batch.accepted``): they are used only when every record was new
    records = workdir / "plain.ndjson"
    records.write_text("".join(json.dumps(event(i)) + "\n" for i in range(5)))
    first = run_main("accept", "--db", db_location, "--scope", scope_file, "--records", records)
    assert first.returncode == 0, first.stderr
    accepted = [json.loads(line) for line in first.stdout.splitlines()]
    assert [r["result"] for r in accepted] == ["accepted"] * 5
    assert len({r["write_id"] for r in accepted}) == 5
    records.write_text("".join(json.dumps(event(i)) + "\n" for i in [5, 2, 5, 6]))
    again = run_main("accept", "--db", db_location, "--scope", scope_file, "--records", records)
    assert again.returncode == 0, again.stderr
    got = [json.loads(line) for line in again.stdout.splitlines()]
    assert strip_ids(got) == [("accepted", "lead-5", None), ("duplicate", "lead-2", None),
                              ("duplicate", "lead-5", None), ("accepted", "lead-6", None)]
    assert got[1]["write_id"] == accepted[2]["write_id"]  # the stored record's
    assert got[2]["write_id"] == got[0]["write_id"]


def test_an_oversized_line_is_answered_and_reading_goes_on(
    workdir: Path, scope_file: Path, db_location: str
) -> None:
    huge = '{"source_lead_id": "' + "x" * (MAX_DOCUMENT_BYTES + 10) + '"}'
    records = workdir / "in.ndjson"
    records.write_text("\n".join([json.dumps(event(1)), huge, json.dumps(event(2))]) + "\n")
    proc = run_main("accept", "--db", db_location, "--scope", scope_file,
                   "--records", records)
    got = [json.loads(line)["result"] for line in proc.stdout.splitlines()]
    reasons = [json.loads(line).get("reason") for line in proc.stdout.splitlines()]
    assert got == ["accepted", "rejected", "accepted"] and reasons[1] == "too_large"


def test_each_answer_comes_after_its_commit_even_from_a_slow_pipe(
    workdir: Path, scope_file: Path, db_location: str
) -> None:
    db = db_location
    child = Child("accept", "--db", db, "--scope", scope_file, "--records", "-", stdin=True)
    try:
        for i in range(3):
            child.send(json.dumps(event(i)) + "\n")
            child.wait_out_lines(i + 1)  # answered before the next line is even written
            status = json.loads(run_main("status", "--db", db).stdout)
            assert status["counts"]["prepared"] == i + 1  # committed when answered
        child.close_stdin()
        assert child.finish() == 0, child.err
    finally:
        child.kill()


def test_unreadable_records_file_changes_nothing(
    workdir: Path, scope_file: Path, missing_location: str
) -> None:
    db = missing_location
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--records", workdir / "none")
    assert proc.returncode == 65 and "cannot read" in proc.stderr
    assert dump_store(db) == ["<absent>"]
    both = run_main("accept", "--db", db, "--scope", scope_file, "--records", "-",
                   "--record", "-")
    assert both.returncode == 2


async def test_concurrent_callers_share_commits(db_location: str) -> None:
    calls: list[int] = []
    async with DurableWorker(db_location, SCOPE) as worker:
        store: Store = worker.store
        real = store.accept_many

        async def counting(items, now):  # type: ignore[no-untyped-def]
            calls.append(len(items))
            return await real(items, now)

        store.accept_many = counting  # type: ignore[method-assign]
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            results[i] = (await worker.accept(event(i % 100))).result

        async with anyio.create_task_group() as tg:
            for i in range(128):
                tg.start_soon(one, i)
        doc = await worker.status()
    assert sorted(results.values()).count("accepted") == 100
    assert sorted(results.values()).count("duplicate") == 28
    assert sum(calls) == 128 and len(calls) < 128  # grouped into fewer commits
    assert doc["counts"]["prepared"] == 100


@given(st.text(max_size=30), st.sampled_from(["accepted", "duplicate", "rejected"]),
       st.one_of(st.none(), st.text(max_size=10)))
def test_answer_line_is_the_json_of_the_answer(key: str, result: str, reason: str | None) -> None:
    from runner.leads.intake import AcceptResult

    answer = AcceptResult(result, key or None, None if result == "rejected" else "w-1",  # type: ignore[arg-type]
                          reason)
    assert json.loads(answer.to_line()) == answer.to_json()


def test_batched_write_ids_are_distinct_time_ordered_uuids() -> None:
    import time
    import uuid

    from runner.leads.intake import new_write_id, new_write_ids

    before = time.time_ns() // 1_000_000
    ids = [*new_write_ids(5000), new_write_id()]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 5001
    for w in ids:
        parsed = uuid.UUID(w)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, w)
        # the first 48 bits are the Unix time in ms when the id was made
        assert before <= parsed.int >> 80 <= after


async def test_a_group_holds_at_most_max_group_lines(workdir: Path) -> None:
    import argparse
    import os

    from runner.commands.bulk import MAX_GROUP, accept_records

    class Recording:
        """Prepares nothing and commits nothing: records each group's size."""

        store = None

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def prepare_lines(self, lines: list[bytes]) -> Group:
            self.sizes.append(len(lines))
            return Group(lines)

        async def commit_lines(self, batch: Group, store: object
                               ) -> tuple[str, int, list[object]]:
            return "", len(batch), []

    class Group(list[bytes]):
        valid = ()  # no record to commit: no key

    records = workdir / "many.ndjson"
    total = 2 * MAX_GROUP + MAX_GROUP // 2
    records.write_bytes(b"".join(json.dumps(event(i)).encode() + b"\n" for i in range(total)))
    intake = Recording()
    fd = os.open(records, os.O_RDONLY)
    try:
        code = await accept_records(argparse.Namespace(log_format="text"), intake, fd)  # type: ignore[arg-type]
    finally:
        os.close(fd)
    assert code == 0
    assert sum(intake.sizes) == total and max(intake.sizes) <= MAX_GROUP
