"""Bulk intake's lanes on PostgreSQL (issue 32 point 3): two sessions commit groups at once,
yet the answers are those of accepting the records one by one, in input order, each after
its commit.

The rule is checked on the lane logic itself with stores that commit when the test lets
them (so that which group finishes first is chosen, never left to timing), then end to end
on the real server."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from runner.clock import SystemClock
from runner.commands.bulk import MAX_GROUP, accept_records
from runner.errors import BadInputError, StoreError
from runner.ids import WriteId
from runner.leads.intake import Batch, Intake
from runner.leads.models import validate_scope
from runner.storedata import AcceptItem, AcceptOutcome
from tests import pg
from tests.helpers import SCOPE, event, run_main

pytestmark = pytest.mark.timeout(120)


class Shared:
    """One store's records, seen by both lanes; each commit is applied whole, in the
    order the lanes apply them (``applied``)."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[str, WriteId]] = {}  # lead id -> (canonical, id)
        self.applied: list[tuple[str, int]] = []  # (lane, first lead number of the group)

    def apply(self, lane: str, items: Sequence[AcceptItem]) -> list[AcceptOutcome]:
        outcomes = []
        for item in items:
            key = item.event.source_lead_id
            if key not in self.records:
                self.records[key] = (item.canonical, item.write_id)
                outcomes.append(AcceptOutcome("accepted", item.write_id))
            else:
                canonical, write_id = self.records[key]
                same = canonical == item.canonical
                outcomes.append(AcceptOutcome("duplicate" if same else "conflict", write_id))
        self.applied.append((lane, int(items[0].event.source_lead_id.split("-")[1])))
        return outcomes


class Lane:
    """A session of the shared store whose commits wait for the test's word (``go``)."""

    def __init__(self, name: str, shared: Shared, *, held: bool = False,
                 fails: bool = False) -> None:
        self.name, self.shared, self.fails = name, shared, fails
        self.go = anyio.Event()
        if not held:
            self.go.set()
        self.started = anyio.Event()  # a commit of this lane has begun
        self.applied = anyio.Event()  # a commit of this lane is applied

    async def accept(self, *args: object) -> AcceptOutcome:
        raise AssertionError("bulk intake commits groups")

    async def accept_many(self, items: Sequence[AcceptItem], now: datetime
                          ) -> list[AcceptOutcome]:
        self.started.set()
        await self.go.wait()
        if self.fails:
            raise StoreError("the session was lost (a test's)")
        outcomes = self.shared.apply(self.name, items)
        self.applied.set()
        return outcomes


class Counting(Intake):
    """Intake that says when it has prepared its ``n``-th group (``prepared[n]``)."""

    def __init__(self, store: Lane) -> None:
        super().__init__(store, SystemClock(), validate_scope(dict(SCOPE)))
        self.prepared = [anyio.Event() for _ in range(8)]
        self.groups = 0

    def prepare_lines(self, lines: Sequence[bytes | BadInputError]) -> Batch:
        batch = super().prepare_lines(lines)
        self.prepared[self.groups].set()
        self.groups += 1
        return batch


async def bulk(lines: list[bytes], intake: Counting, second: Lane | None,
               tmp: Path) -> tuple[int | str, list[dict[str, object]]]:
    """``accept --records`` over ``intake``'s store and (opened beside it) ``second``:
    the exit code (or the store error's message) and the answers printed."""
    records = tmp / "records.ndjson"
    records.write_bytes(b"".join(line + b"\n" for line in lines))

    async def open_lane() -> Lane:
        assert second is not None
        return second

    out = io.StringIO()
    fd = os.open(records, os.O_RDONLY)
    try:
        with contextlib.redirect_stdout(out):
            try:
                code: int | str = await accept_records(
                    argparse.Namespace(log_format="text"), intake, fd,
                    open_lane if second is not None else None)
            except StoreError as exc:
                code = exc.message
    finally:
        os.close(fd)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def group(start: int, n: int = MAX_GROUP, **overrides: object) -> list[bytes]:
    return [json.dumps(event(i, **overrides)).encode() for i in range(start, start + n)]


async def one_by_one(lines: list[bytes], tmp: Path) -> list[dict[str, object]]:
    """The answers of the same records through one session (the rule's reference)."""
    (tmp / "ref").mkdir()
    code, answers = await bulk(lines, Counting(Lane("ref", Shared())), None, tmp / "ref")
    assert code in (0, 65)
    return answers


def shape(answers: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(a["result"], a["source_lead_id"], a.get("reason")) for a in answers]


def start(tg: anyio.abc.TaskGroup, lines: list[bytes], intake: Counting, second: Lane,
          tmp: Path) -> list[tuple[int | str, list[dict[str, object]]]]:
    """Run ``bulk`` in ``tg``; its result lands in the list returned."""
    result: list[tuple[int | str, list[dict[str, object]]]] = []

    async def run() -> None:
        result.append(await bulk(lines, intake, second, tmp))

    tg.start_soon(run)
    return result


async def settle() -> None:
    """Let every task that can run, run (no timer: a bounded number of yields)."""
    for _ in range(200):
        await anyio.lowlevel.checkpoint()


async def second_group_ready(first: Lane, intake: Counting) -> None:
    """Until the first group's commit has begun (held) and the second group is prepared,
    then until every task that can run has run."""
    with anyio.fail_after(30):
        await first.started.wait()
        await intake.prepared[1].wait()
    await settle()


async def test_groups_without_a_shared_key_commit_at_once(tmp_path: Path) -> None:
    shared = Shared()
    first = Lane("first", shared, held=True)
    second = Lane("second", shared)
    lines = group(0) + group(MAX_GROUP)
    async with anyio.create_task_group() as tg:
        result = start(tg, lines, Counting(first), second, tmp_path)
        with anyio.fail_after(30):
            # the second group is committed by the other session while the first waits
            await second.applied.wait()
        assert shared.applied[0][0] == "second" and first.started.is_set()
        first.go.set()
    code, answers = result[0]
    assert code == 0
    assert [a["source_lead_id"] for a in answers] == [f"lead-{i}" for i in range(2 * MAX_GROUP)]
    assert {a["result"] for a in answers} == {"accepted"}


def repeating(n: int) -> list[bytes]:
    """``n`` records where every 100th from the 100th on repeats lead-0, changed, and the
    one after it repeats lead-1 as it was: every group but the first (groups are whatever
    input has arrived, never fewer than 100 lines here but the last) holds a key of the
    first group."""
    lines = group(0, n)
    for at in range(100, n - 1, 100):
        lines[at] = json.dumps(event(0, contact_alias="changed")).encode()
        lines[at + 1] = json.dumps(event(1)).encode()
    return lines


async def test_a_group_sharing_a_key_waits_for_the_group_before(tmp_path: Path) -> None:
    lines = repeating(2 * MAX_GROUP)
    expected = await one_by_one(lines, tmp_path)
    shared = Shared()
    first = Lane("first", shared, held=True)
    second = Lane("second", shared)
    intake = Counting(first)
    async with anyio.create_task_group() as tg:
        result = start(tg, lines, intake, second, tmp_path)
        # the second session is open and idle, and the second group is ready: it must not
        # commit before the first, whose keys it holds
        await second_group_ready(first, intake)
        assert shared.applied == [] and not second.started.is_set()
        first.go.set()
    code, answers = result[0]
    assert code == 65  # each changed lead-0 is a conflict
    assert shape(answers) == shape(expected)
    assert shared.applied[0] == ("first", 0)
    assert answers[100]["reason"] == "conflict"
    assert answers[101]["result"] == "duplicate"
    assert answers[101]["write_id"] == answers[1]["write_id"]


async def test_a_failed_group_ends_the_run_before_its_answers(tmp_path: Path) -> None:
    shared = Shared()
    first = Lane("first", shared, held=True, fails=True)
    second = Lane("second", shared)
    lines = group(0) + group(MAX_GROUP) + group(2 * MAX_GROUP)
    async with anyio.create_task_group() as tg:
        result = start(tg, lines, Counting(first), second, tmp_path)
        with anyio.fail_after(30):
            await second.applied.wait()
        first.go.set()
    code, answers = result[0]
    # the store's error, and no answer at all: the first group never committed, and the
    # second's answers come after the first's (it did commit: accepting it again answers
    # "duplicate" with the stored write_id)
    assert code == "the session was lost (a test's)"
    assert answers == []


async def test_a_group_after_a_failed_one_with_its_key_never_commits(tmp_path: Path) -> None:
    shared = Shared()
    first = Lane("first", shared, held=True, fails=True)
    second = Lane("second", shared)
    lines = repeating(2 * MAX_GROUP)
    intake = Counting(first)
    async with anyio.create_task_group() as tg:
        result = start(tg, lines, intake, second, tmp_path)
        await second_group_ready(first, intake)  # it waits for the first, on its idle session
        assert not second.started.is_set()
        first.go.set()
    code, answers = result[0]
    assert code == "the session was lost (a test's)" and answers == []
    assert shared.applied == [] and not second.started.is_set()


def test_bulk_accept_on_postgres_answers_as_one_by_one_across_groups(
        workdir: Path, scope_file: Path) -> None:
    pg.require()
    # 6 groups; each group from the second on repeats two keys of the one before (one as
    # it was, one changed), so the two sessions meet on shared keys at every boundary
    n = 6 * MAX_GROUP
    docs = [event(i) for i in range(n)]
    for start in range(MAX_GROUP, n, MAX_GROUP):
        docs[start + 1] = event(start - 3)
        docs[start + 2] = event(start - 2, contact_alias="changed")
    records = workdir / "records.ndjson"
    records.write_text("".join(json.dumps(d) + "\n" for d in docs))
    schemas = [pg.new_schema(), pg.new_schema()]
    try:
        lanes = run_main("accept", "--db", pg.location(schemas[0]), "--scope", scope_file,
                         "--records", records, "--log-level", "debug")
        one = run_main("accept", "--db", str(workdir / "one.db"), "--scope", scope_file,
                       "--records", records)
        assert lanes.returncode == one.returncode == 65, lanes.stderr[-2000:]
        got = [json.loads(line) for line in lanes.stdout.splitlines()]
        want = [json.loads(line) for line in one.stdout.splitlines()]
        assert shape(got) == shape(want) and len(got) == n
        assert "a second session joins the bulk accept" in lanes.stderr
        status = json.loads(run_main("status", "--db", pg.location(schemas[0])).stdout)
        accepted = sum(1 for a in got if a["result"] == "accepted")
        assert status["counts"]["prepared"] == accepted == n - 2 * 5
        duplicates = [a for a in got if a["result"] == "duplicate"]
        first_id = {a["source_lead_id"]: a["write_id"] for a in got if a["result"] == "accepted"}
        assert len(duplicates) == 5
        assert all(a["write_id"] == first_id[a["source_lead_id"]] for a in duplicates)
    finally:
        pg.drop_later(schemas)
