"""Fault injection as a wrapper around any adapter (SPEC L10, ARCHITECTURE idea 3).

Faults are not flags inside the synthetic target: wrapping lets a user's own adapter be
tested under exactly the same faults.  A fault applies to every call of its kind in the
run; a crash fault fires at the first.  Crashes are ``os._exit(73)``: no cleanup, no
``finally``, no flushing — as close to a power cut as a process can get.

``rate-limited`` makes the target keep a quota of its own, as a real API does: at most
``RATE_LIMIT_REQUESTS`` write requests per ``RATE_LIMIT_WINDOW`` seconds; a request over it
is answered ``RateLimited`` with the seconds left in the window as ``retry_after``, and
nothing is applied (a ``BeforeWriteError``: the records are sent again later).  ``slow``
makes every call take ``SLOW_SECONDS`` more (a target far away, or loaded).

``hang`` and ``hang-readback`` are for tests: the call blocks (really blocks, in its
thread) until a file named ``release`` appears in ``$RUNNER_HANG_DIR``; on entering it
creates ``entered-<call>`` there, so a test can wait for the moment it is stuck.  ``hang``
blocks after the target has committed the row, like a request whose response never
comes back: whatever happens to the worker, the row is there to be read back.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import UsageError
from runner.ids import BatchMark, TargetMark
from runner.leads.capabilities import marks
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    CRMAdapter,
    Observation,
    RateLimited,
    TargetReadError,
    TargetRow,
    dedupes,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord

HANG_DIR_ENV = "RUNNER_HANG_DIR"
CRASH_EXIT = 73
#: ``--fault rate-limited``: the target's own quota of write requests per window
RATE_LIMIT_REQUESTS = 2
RATE_LIMIT_WINDOW = 1.0
#: ``--fault slow``: what every call takes more
SLOW_SECONDS = 0.2


class Fault(enum.StrEnum):
    OUTAGE = "outage"
    TIMEOUT = "timeout"
    CRASH_AFTER_WRITE = "crash-after-write"
    CRASH_BEFORE_WRITE = "crash-before-write"
    READ_ERROR = "read-error"
    HANG = "hang"
    HANG_READBACK = "hang-readback"
    RATE_LIMITED = "rate-limited"
    SLOW = "slow"


TEST_ONLY = frozenset({Fault.HANG, Fault.HANG_READBACK})


#: ``--fault crash-at:<point>[@<n>]`` arms a named crash point (``runner.crashpoints``);
#: it is a fault of the process, not of the target, so the wrapper ignores it
CRASH_AT = "crash-at:"


def parse_faults(values: Iterable[str] | None) -> frozenset[Fault]:
    faults = set()
    for value in values or ():
        if value.startswith(CRASH_AT):
            continue
        try:
            faults.add(Fault(value))
        except ValueError:
            # the faults ``--help`` lists: the hang faults are for tests ($RUNNER_HANG_DIR)
            names = ", ".join([*(f.value for f in Fault if f not in TEST_ONLY),
                               CRASH_AT + "POINT[@N]"])
            raise UsageError(f"unknown fault {value!r} (known: {names})") from None
    if faults & TEST_ONLY and not os.environ.get(HANG_DIR_ENV):
        raise UsageError(f"the hang faults are for tests and need ${HANG_DIR_ENV}")
    return frozenset(faults)


def crash_point_option(values: Iterable[str] | None) -> str | None:
    """The one ``crash-at:`` value among ``--fault`` options, if any."""
    found = [value for value in values or () if value.startswith(CRASH_AT)]
    if len(found) > 1:
        raise UsageError("only one --fault crash-at:POINT may be given")
    return found[0] if found else None


def crash(where: str) -> None:
    """Exit at once, as a crash would: no cleanup of any kind."""
    os.write(2, f"runner: simulated crash {where} (exit {CRASH_EXIT})\n".encode())
    os._exit(CRASH_EXIT)


def hang(call: str) -> None:
    """Block this thread until the test releases it."""
    directory = Path(os.environ[HANG_DIR_ENV])
    (directory / f"entered-{call}").touch()
    while not (directory / "release").exists():
        time.sleep(0.005)


class FaultyAdapter:
    """Wraps an adapter and injects the given faults into its calls."""

    def __init__(self, inner: CRMAdapter, faults: frozenset[Fault]) -> None:
        self.inner = inner
        self.faults = faults
        self._quota = _Quota(RATE_LIMIT_REQUESTS, RATE_LIMIT_WINDOW)
        #: write requests answered RateLimited (tests and the bench read it)
        self.rate_limited = 0

    def _slow(self) -> None:
        if Fault.SLOW in self.faults:
            time.sleep(SLOW_SECONDS)

    def write(self, record: CRMRecord, write_id: str) -> Sequence[TargetRow] | None:
        """The inner write, under the faults; the rows it returned, passed through (a fault
        after the request raises instead: its answer is lost)."""
        self._before_request()
        rows = self.inner.write(record, write_id)
        self._after_request()
        return rows

    def _before_request(self) -> None:
        self._slow()
        if Fault.CRASH_BEFORE_WRITE in self.faults:
            crash("before the target write")
        if Fault.OUTAGE in self.faults:
            raise BeforeWriteError("simulated outage: the request was not sent")
        if Fault.RATE_LIMITED in self.faults:
            wait = self._quota.take()
            if wait is not None:
                self.rate_limited += 1
                raise RateLimited("simulated quota: too many requests", retry_after=wait)

    def _after_request(self) -> None:
        if Fault.HANG in self.faults:
            hang("write")
        if Fault.CRASH_AFTER_WRITE in self.faults:
            crash("after the target write")
        if Fault.TIMEOUT in self.faults:
            raise AmbiguousWriteError("simulated timeout after the request was sent")

    @property
    def dedupes_write_id(self) -> bool:
        """The inner adapter's declaration (faults are of calls, not of the target)."""
        return dedupes(self.inner)

    @property
    def max_batch(self) -> int | None:
        """The inner adapter's largest batch (None: it has none)."""
        value: int | None = getattr(self.inner, "max_batch", None)
        return value

    @property
    def max_read(self) -> int | None:
        """The most write_ids one read of the inner adapter may carry (None: no limit)."""
        value: int | None = getattr(self.inner, "max_read", None)
        return value

    @property
    def batches(self) -> bool:
        """A batch is sent only to an inner adapter that can take one."""
        return callable(getattr(self.inner, "write_batch", None))

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]], *,
                    mark: BatchMark | None = None) -> Sequence[TargetRow] | None:
        """The same faults as ``write``, for one request of many rows (its batch mark
        passed through)."""
        self._before_request()
        inner = self.inner.write_batch  # type: ignore[attr-defined]
        rows: Sequence[TargetRow] | None = (inner(items) if mark is None
                                            else inner(items, mark=mark))
        self._after_request()
        return rows

    @property
    def marks_batches(self) -> bool:
        """The inner adapter's declaration (SPEC E8)."""
        return marks(self.inner)

    def read_mark(self) -> TargetMark:
        mark: TargetMark = self.inner.read_mark()  # type: ignore[attr-defined]
        return mark

    def raise_mark(self, mark: BatchMark, replaces: str | None = None) -> TargetMark:
        """The fence, raised at every start: passed through (the faults are of the sends
        of records, and a fence carries none)."""
        self._slow()
        replaced: TargetMark = self.inner.raise_mark(  # type: ignore[attr-defined]
            mark, replaces)
        return replaced

    def read_by_keys(self, keys: Sequence[tuple[str, str]]) -> Sequence[TargetRow]:
        self._slow()
        rows: Sequence[TargetRow] = self.inner.read_by_keys(keys)  # type: ignore[attr-defined]
        return rows

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        self._slow()
        if Fault.HANG_READBACK in self.faults:
            hang("read_back")
        many = getattr(self.inner, "read_back_many", None)
        if callable(many):
            return list(many(write_ids))
        return [row for write_id in write_ids for row in self.inner.read_back(write_id)]

    def target_id(self) -> str | None:
        """The inner adapter's identity (faults are of calls, not of which target)."""
        inner = getattr(self.inner, "target_id", None)
        return inner() if callable(inner) else None

    def prepare_writes(self, create: bool) -> None:
        inner = getattr(self.inner, "prepare_writes", None)
        if callable(inner):
            inner(create)

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        self._slow()
        if Fault.HANG_READBACK in self.faults:
            hang("read_back")
        return self.inner.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        self._slow()
        if Fault.READ_ERROR in self.faults:
            raise TargetReadError("simulated status read error")
        return self.inner.observe_status(write_ids)


class _Quota:
    """A fixed-window request quota, as a target keeps one: ``take`` answers None (the
    request may go) or the seconds left in the window (it may not)."""

    def __init__(self, requests: int, window: float) -> None:
        self.requests, self.window = requests, window
        self._lock = threading.Lock()
        self._start = float("-inf")
        self._used = 0

    def take(self) -> float | None:
        with self._lock:
            now = time.monotonic()
            if now - self._start >= self.window:
                self._start, self._used = now, 0
            if self._used < self.requests:
                self._used += 1
                return None
            return self._start + self.window - now
