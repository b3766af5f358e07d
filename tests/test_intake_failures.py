"""Intake under failure: a store error ends a bulk stream with its own exit code, and text
no store can keep is refused at intake the same way on both backends."""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from runner.cli import main
from runner.commands import bulk
from runner.commands.bulk import accept_records
from runner.errors import StoreError
from tests import pg
from tests.helpers import SCOPE, event, ndjson, write_json


class Group(list[Any]):
    valid = ()  # no record to commit: no key


class FailingIntake:
    """Prepares every record; the second commit fails as a full store does."""

    store = None

    def __init__(self) -> None:
        self.commits = 0

    def prepare_lines(self, lines: list[Any]) -> Group:
        return Group(lines)

    async def commit_lines(self, batch: Group, store: object) -> tuple[str, int, list[Any]]:
        self.commits += 1
        if self.commits == 2:
            raise StoreError("no space left on the store's disk")
        return "", 0, []


def _feed(fd: int, lines: int) -> None:
    try:
        with os.fdopen(fd, "wb") as out:
            for i in range(lines):
                out.write(json.dumps(event(i)).encode() + b"\n")
    except BrokenPipeError:
        pass  # the reader stopped: what the test expects


@pytest.mark.parametrize("attempt", range(5))
async def test_a_store_error_in_a_bulk_stream_is_that_error_not_a_group(
    attempt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the store error abandons the reader thread (``abandon_on_cancel``); it ends at its
    # next read or delivery, and only then may the descriptor go: closed earlier, its
    # number is reused by the next test's files (its scope file, say), which that thread
    # would then read
    reader_done = threading.Event()
    original = bulk.split_lines

    def split_lines(fd: int, deliver: Any) -> None:
        try:
            original(fd, deliver)
        finally:
            reader_done.set()

    monkeypatch.setattr(bulk, "split_lines", split_lines)
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(target=_feed, args=(write_fd, 20_000), daemon=True)
    writer.start()
    args = argparse.Namespace(log_format="text")
    threshold = gc.get_threshold()
    try:
        with pytest.raises(StoreError):
            await accept_records(args, FailingIntake(), read_fd)  # type: ignore[arg-type]
        assert gc.get_threshold() == threshold  # the collector's setting is given back
    finally:
        # (waited for in a thread: its last delivery needs this loop)
        assert await anyio.to_thread.run_sync(reader_done.wait, 30), "the reader did not end"
        os.close(read_fd)
        writer.join(timeout=30)


def test_a_nul_in_one_record_rejects_that_record_and_the_stream_goes_on(
        db_location: str, scope_file: Path, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    records = workdir / "records.ndjson"
    docs = [event(1), event("2\x00"), event(3, contact_alias="a\x00b"), event(4)]
    records.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    code = main(["accept", "--db", db_location, "--scope", str(scope_file),
                 "--records", str(records)])
    out = capsys.readouterr()
    answers = [json.loads(line) for line in out.out.splitlines()]
    assert code == 65
    assert [a["result"] for a in answers] == ["accepted", "rejected", "rejected", "accepted"]
    assert "source_lead_id: must not contain the NUL character" in answers[1]["reason"] + \
        out.err
    assert "contact_alias: must not contain the NUL character" in out.err
    assert "a\\x00b" not in out.err and "a\\u0000b" not in out.err
    assert main(["status", "--db", db_location, "--records"]) == 0
    records = ndjson(capsys.readouterr().out)
    assert sorted(r["source_lead_id"] for r in records) == ["lead-1", "lead-4"]


def test_a_scope_with_a_nul_is_refused(db_location: str, workdir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    scope = write_json(workdir / "scope.json", {**SCOPE, "form_id": "f\x00"})
    record = write_json(workdir / "e.json", event(1))
    assert main(["accept", "--db", db_location, "--scope", str(scope),
                 "--record", str(record)]) == 65
    assert "form_id: must not contain the NUL character" in capsys.readouterr().err


async def test_a_postgresql_statement_timeout_is_named_as_a_timeout() -> None:
    pg.require()
    import asyncpg

    from runner.io.postgres.connection import translate

    conn = await asyncpg.connect(pg.dsn())
    try:
        await conn.execute("SET statement_timeout = 1")
        with pytest.raises(asyncpg.exceptions.QueryCanceledError) as info:
            await conn.execute("SELECT pg_sleep(5)")
    finally:
        await conn.close()
    error = translate(info.value, "accepting records", "127.0.0.1:5432")
    assert isinstance(error, StoreError) and error.exit_code == 74
    assert "statement_timeout" in error.message
    assert "lost the connection" not in error.message
