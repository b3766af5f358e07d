"""Bulk intake: ``accept --records FILE`` (NDJSON, ``-`` for stdin).

One JSON answer per record, in input order, each printed only after the commit that holds
its record.  Records are committed in groups: whatever has arrived while the previous
group was being committed forms the next group (up to ``MAX_GROUP``), so a fast file is
committed a thousand records at a time and a slow producer on a pipe is answered line by
line, without waiting for a batch to fill.

The input is read in a worker thread with ``os.read``, which returns what is available
instead of waiting for a full buffer; lines are split here, and a line longer than the
document limit is answered ``too_large`` without being held in memory.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from runner.commands.common import say_error
from runner.errors import BadInputError, RunnerError
from runner.jsonio import MAX_DOCUMENT_BYTES

if TYPE_CHECKING:
    import anyio.abc

    from runner.leads.intake import AcceptResult, Batch, Intake
    from runner.store import IntakeStore

log = logging.getLogger(__name__)

MAX_GROUP = 1000
#: sessions committing groups at once on PostgreSQL: the first, and one opened beside it
#: (``open_lane``); two keep both cores of a 2-core server busy, a third measured no
#: faster (47k/s against 46k/s for 100,000 records, whole process)
LANES = 2
CHUNK = 1 << 16
Line = bytes | BadInputError


def split_lines(fd: int, deliver: Callable[[list[Line]], None]) -> None:
    """Read ``fd`` to its end, delivering complete lines in groups as they arrive."""
    pending = b""
    oversized = False
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            break
        *complete, pending = (pending + chunk).split(b"\n")
        lines: list[Line] = []
        for line in complete:
            if oversized:
                lines.append(_too_large())
                oversized = False
            else:
                lines.append(line)
        if len(pending) > MAX_DOCUMENT_BYTES:
            pending, oversized = b"", True  # drop it; answer it when its line ends
        for start in range(0, len(lines), MAX_GROUP):
            deliver(lines[start : start + MAX_GROUP])
    if oversized:
        deliver([_too_large()])
    elif pending.strip():
        deliver([pending])


def _too_large() -> BadInputError:
    return BadInputError(f"record is larger than {MAX_DOCUMENT_BYTES} bytes", reason="too_large")


async def _read(fd: int, send: MemoryObjectSendStream[list[Line]]) -> None:
    def deliver(lines: list[Line]) -> None:
        anyio.from_thread.run(send.send, lines)

    async with send:
        await anyio.to_thread.run_sync(split_lines, fd, deliver, abandon_on_cancel=True)


def open_records(path: str) -> int:
    if path == "-":
        return sys.stdin.fileno()
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInputError(f"cannot read records file {path!r}: {exc.strerror}",
                            reason="unreadable") from None


async def accept_records(args: argparse.Namespace, intake: Intake, fd: int,
                         open_lane: Callable[[], Awaitable[IntakeStore]] | None = None
                         ) -> int:
    """Answer every record of ``fd``; exit 65 if any was rejected, else 0.

    Three stages, so that the work overlaps: a thread reads lines; the next group is
    parsed and validated while the previous one is being committed (SQLite releases the
    GIL while it writes); answers are printed, in order, after each commit.

    ``open_lane``: opens another session of the same store (PostgreSQL), opened beside
    the first groups' work and used as soon as it is ready: it commits a group of its own
    while ``intake.store`` commits another, so that the server inserts two groups at once.
    Groups still start in input order and are answered in it.  A lane that cannot be
    opened is left out (one session does all the work, as without it).
    """
    with young_generation(YOUNG_OBJECTS):
        return await _accept_records(args, intake, fd, open_lane)


#: the cyclic collector's youngest generation while a bulk accept runs (CPython's default
#: is 700 objects)
YOUNG_OBJECTS = 20_000


@contextmanager
def young_generation(size: int) -> Iterator[None]:
    """Let ``size`` container objects be allocated (net) before the cyclic collector runs.

    A group in flight holds a few objects per record (its event, tuples), two groups
    about ten thousand: with the default threshold (700) the collector ran some 600 times
    per 100,000 records, each time moving the live groups to an older generation that
    then had to be walked too (a tenth of the process's CPU time, measured).  Objects are
    still freed as before (by reference counting, when their group is answered); only
    cyclic garbage waits longer, and the collector still runs once ``size`` of it pile up.
    The previous threshold is restored afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(max(size, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


async def _accept_records(args: argparse.Namespace, intake: Intake, fd: int,
                          open_lane: Callable[[], Awaitable[IntakeStore]] | None) -> int:
    from runner.leads.intake import Batch

    lines_in, lines_out = anyio.create_memory_object_stream[list[Line]](max_buffer_size=4)
    ready_in, ready_out = anyio.create_memory_object_stream[Batch](max_buffer_size=1)
    slots_in, slots_out = anyio.create_memory_object_stream[_Slot](max_buffer_size=LANES)
    free: list[IntakeStore] = [intake.store]
    lane_freed = anyio.Condition()
    opening = anyio.CancelScope()
    rejected = 0
    number = 0
    failure: RunnerError | None = None

    async def commit(slot: _Slot, store: IntakeStore, earlier: list[_Slot]) -> None:
        try:
            for other in earlier:  # a key of this group is also in one still committing
                await other.done.wait()
                if other.failed:  # never commit a record ahead of one before it
                    raise other.failed
            slot.answer = await intake.commit_lines(slot.batch, store)
        except RunnerError as exc:
            slot.failed = exc
        finally:
            slot.done.set()
            async with lane_freed:
                free.append(store)
                lane_freed.notify()

    async def dispatch(tg: anyio.abc.TaskGroup) -> None:
        """Commit each group on a free lane, in input order; a group that shares a key
        with one still committing waits for it (the first occurrence of a key wins, as if
        the records were accepted one by one)."""
        in_flight: list[_Slot] = []
        async with ready_out, slots_in:
            async for batch in ready_out:
                async with lane_freed:
                    while not free:
                        await lane_freed.wait()
                    store = free.pop(0)
                in_flight = [s for s in in_flight if not s.done.is_set()]
                slot = _Slot(batch, keyed=open_lane is not None)
                earlier = [s for s in in_flight if not s.keys.isdisjoint(slot.keys)]
                tg.start_soon(commit, slot, store, earlier)
                in_flight.append(slot)
                await slots_in.send(slot)

    async def add_lane(opener: Callable[[], Awaitable[IntakeStore]]) -> None:
        with opening:
            try:
                store = await opener()
            except RunnerError as exc:
                log.debug("bulk accept goes on without another session: %s", exc)
                return
            log.debug("a second session joins the bulk accept")
            async with lane_freed:
                free.append(store)
                lane_freed.notify()

    async with anyio.create_task_group() as tg:
        tg.start_soon(_read, fd, lines_in)
        tg.start_soon(_prepare, intake, lines_out, ready_in)
        tg.start_soon(dispatch, tg)
        if open_lane is not None:
            tg.start_soon(add_lane, open_lane)
        async with slots_out:
            async for slot in slots_out:  # answers in input order, each after its commit
                await slot.done.wait()
                if slot.failed is not None:
                    # a store error ends the run with its own exit code: stop the reader,
                    # the parser and the other lanes first, so that closing the streams
                    # between them cannot add a BrokenResourceError beside it (every
                    # answer printed was committed)
                    failure = slot.failed
                    tg.cancel_scope.cancel()
                    break
                if slot.answer is None:  # its commit was cancelled: so is this run
                    break
                text, answered, refused = slot.answer
                if text:
                    sys.stdout.write(text)
                for index, result in refused:
                    say_error(args, f"record {number + index + 1}: rejected: "
                              f"{result.message}", result.reason or "rejected")
                sys.stdout.flush()
                number += answered
                rejected += len(refused)
        opening.cancel()  # every answer is out: a lane still opening is not needed
    if failure is not None:
        raise failure
    return 65 if rejected else 0


class _Slot:
    """A group on its way through a lane: its keys, then its answer or its failure."""

    def __init__(self, batch: Batch, *, keyed: bool) -> None:
        self.batch = batch
        # one bulk accept holds one scope, so one tenant: the lead ids are the keys (with
        # one lane, never two groups commit at once: no key is compared)
        self.keys: set[str] = ({v[1].source_lead_id for v in batch.valid} if keyed
                               else set())
        self.done = anyio.Event()
        self.answer: tuple[str, int, list[tuple[int, AcceptResult]]] | None = None
        self.failed: RunnerError | None = None


async def _prepare(
    intake: Intake,
    lines_out: MemoryObjectReceiveStream[list[Line]],
    ready_in: MemoryObjectSendStream[Batch],
) -> None:
    async with lines_out, ready_in:
        async for lines in lines_out:
            pending = lines
            while pending:
                while len(pending) < MAX_GROUP:  # take whatever else has arrived meanwhile
                    try:
                        pending += lines_out.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                # at most MAX_GROUP lines per group; the rest starts the next one, which
                # never waits for more input than has arrived
                group, pending = pending[:MAX_GROUP], pending[MAX_GROUP:]
                await ready_in.send(intake.prepare_lines([ln for ln in group
                                                          if not _blank(ln)]))


def _blank(line: Line) -> bool:
    return isinstance(line, bytes) and not line.strip()




