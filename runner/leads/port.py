"""The CRM port (SPEC L9): what a target adapter implements, and the bridge runner calls.

An adapter is plain blocking code (an HTTP client, a spreadsheet API, a SQLite file) with
three methods::

    write(record, write_id) -> rows | None     raise BeforeWriteError only if the request
                                               certainly did not leave; anything else is
                                               uncertain
    read_back(write_id) -> list[TargetRow]     the rows carrying that write_id
    observe_status(write_ids) -> {write_id: Observation}

optionally, two that let a target take many records in one request (issue 16)::

    write_batch(items) -> rows | None          items: (record, write_id) pairs, applied
                                               atomically (all rows or none); the same
                                               errors and return as ``write``
    read_back_many(write_ids) -> list[TargetRow]   the rows carrying any of those write_ids

(a target without ``write_batch`` is sent one record per request, as before; without
``read_back_many``, a batch is read back one ``read_back`` per record).  A write may
return the rows the target's answer says it holds after applying (issue 29): for every
write_id of the request every row held for it, and no other.  runner then judges each
record from them (``classify_readback``) instead of reading back; None means "not given"
(read back, as before); rows that do not cover the request prove nothing (uncertain:
reconciled by readback).  Then: attributes that
declare the target's limits and promises (``max_batch``, ``max_read``,
``dedupes_write_id``: :mod:`runner.leads.capabilities`, read and checked there); and two
methods that let runner check the target before work (SPEC L9, E6)::

    target_id() -> str | None                  the target's stable identity, read without
                                               creating or changing anything; None: this
                                               target cannot be pinned
    prepare_writes(create) -> None             make sure writes can start (it opens, it is
                                               writable); may create a new target only if
                                               ``create``

A store pins the identity of the first target it delivers to, as it pins its scope, and
refuses any other one later (``runner.tasks.target``); only the pinned target can report a
record explicitly missing.  An adapter without ``target_id`` (or answering None) keeps
working as before: it cannot be pinned, so runner trusts it to be the store's own.

:class:`CRMRecordPort` maps a validated event to the adapter's narrower record and runs
each call in a worker thread (a send, in the dispatch run's own thread), so that
cancellation and shielding act on a call that is really blocked.  A cancelled call is
abandoned, not stopped: the thread may still finish its write, which is exactly why a
cancelled send is *uncertain*.

Errors (:mod:`runner.leads.target_errors`, re-exported here): :class:`BeforeWriteError` is
the one typed error that allows another send.  Adapters translate their own failures at
their edge into :class:`TargetError` subclasses; any other exception is treated the same
as an ambiguous failure.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import anyio

from runner import crashpoints
from runner.ids import BatchMark, TargetMark

# re-exported: adapters and wrappers read the declarations from the port, as before
from runner.leads.capabilities import dedupes as dedupes
from runner.leads.capabilities import marks
from runner.leads.capabilities import max_batch as max_batch
from runner.leads.capabilities import max_read as max_read
from runner.leads.failures import FAILURES
from runner.leads.pacing import Pacer

# re-exported: what a target holds and what a readback proves live in runner.leads.rows
from runner.leads.rows import READBACK_WORDS as READBACK_WORDS
from runner.leads.rows import Missing as Missing
from runner.leads.rows import Observation as Observation
from runner.leads.rows import Readback as Readback
from runner.leads.rows import ReadFailure as ReadFailure
from runner.leads.rows import Snapshot as Snapshot
from runner.leads.rows import TargetRow as TargetRow
from runner.leads.rows import classify_readback as classify_readback
from runner.leads.rows import exactly as exactly
from runner.leads.rows import observe_rows as observe_rows
from runner.leads.rows import readback_in_words as readback_in_words
from runner.leads.rows import written_rows as written_rows

# re-exported: the errors of a target call live in runner.leads.target_errors
from runner.leads.target_errors import AmbiguousWriteError as AmbiguousWriteError
from runner.leads.target_errors import BeforeWriteError as BeforeWriteError
from runner.leads.target_errors import RateLimited as RateLimited
from runner.leads.target_errors import RejectedWrite as RejectedWrite
from runner.leads.target_errors import TargetError as TargetError
from runner.leads.target_errors import TargetReadError as TargetReadError
from runner.leads.target_errors import describe_failure as describe_failure
from runner.logs import Repeats

if TYPE_CHECKING:  # the models (pydantic) load when a record is mapped, not before
    from runner.leads.models import CRMRecord, LeadEvent


@functools.cache
def _crm_record() -> type[CRMRecord]:
    """``CRMRecord``, imported at the first record mapped: once, since an import statement
    run per record (dispatch maps each record it sends and each it reads back) costs
    0.8 µs a time against 0.03 µs for this cached call, measured by ``timeit``."""
    from runner.leads.models import CRMRecord

    return CRMRecord


class CRMAdapter(Protocol):
    """What a target adapter implements.  Methods block; runner calls them in a thread."""

    def write(self, record: CRMRecord, write_id: str) -> Sequence[TargetRow] | None: ...

    def read_back(self, write_id: str) -> Sequence[TargetRow]: ...

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]: ...


class BatchAdapter(Protocol):
    """The optional batch calls of an adapter (see the module docstring)."""

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]
                    ) -> Sequence[TargetRow] | None: ...

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]: ...


class IdentifiedAdapter(Protocol):
    """The optional identity of an adapter's target (see the module docstring)."""

    def target_id(self) -> str | None: ...


class PreparedAdapter(Protocol):
    """The optional check that a target can take writes (see the module docstring)."""

    def prepare_writes(self, create: bool) -> None: ...


@dataclass(frozen=True)
class SendResult:
    """What a send proved: see :meth:`CRMRecordPort.send_blocking`."""

    verdict: Literal["not_sent", "failed", "unproven"] | Readback
    #: ``not_sent``, ``failed``, ``unproven``: what happened in words (kept with the
    #: record, ``last_error``); else None
    error: str | None = None
    #: ``not_sent`` by a ``RateLimited`` answer that said when to come back (seconds)
    retry_after: float | None = None
    #: the kind of ``error`` (one of :data:`FAILURES`; ``last_failure``)
    failure: str | None = None


def _not_sent(exc: BeforeWriteError, retry_after: float | None) -> SendResult:
    """A send that certainly did not leave, with what the adapter said."""
    kind, words = describe_failure(exc)
    return SendResult("not_sent", error=words, retry_after=retry_after, failure=kind)


def _unproven_rows(reason: str) -> SendResult:
    """A write that returned rows proving nothing (see :func:`written_rows`)."""
    return SendResult("unproven", error=f"{FAILURES['malformed']}: {reason}",
                      failure="malformed")


def _failed(verdict: Literal["failed", "unproven"], exc: BaseException) -> SendResult:
    """A send that may have been applied: ``failed`` (the write raised) or ``unproven``
    (the write returned, the readback raised)."""
    kind, words = describe_failure(exc)
    if verdict == "unproven":
        kind, words = "unproven", f"{FAILURES['unproven']}: {words}"
    return SendResult(verdict, error=words, failure=kind)


class CRMRecordPort:
    """The bridge between validated events and an adapter (L9, L14).

    Every request to the target goes through one of the port's two :class:`Pacer` s
    (issue 16; separate quotas as real spreadsheet APIs keep them): a batch write takes a
    token of ``pacer`` (the write quota), a readback, a reconcile read or a status read a
    token of ``read_pacer`` (the read quota; by default no quota: reads are not paced).
    A ``RateLimited`` answer to any request holds *every* later request, reads and
    writes, until its ``retry_after`` has passed.  A send's write token is taken by the
    caller (``runner.tasks.deliver`` waits for it *before* the in-flight mark, so a wait
    never holds a record in flight); the send's readback takes a read token."""

    def __init__(self, adapter: CRMAdapter, pacer: Pacer | None = None,
                 read_pacer: Pacer | None = None) -> None:
        self.adapter = adapter
        self.max_batch = max_batch(adapter)
        self.max_read = max_read(adapter)
        dedupes(adapter)  # a declaration that is not a bool is refused before any work
        marks(adapter)  # likewise
        #: the store this port sends for, once known (a marked batch carries it)
        self.store_id: str | None = None
        #: the target's fence could not be raised at this start: nothing is sent until it
        #: is (``runner.tasks.rewind.fence``; each cycle tries again)
        self.fence_pending = False
        #: the write quota (batch writes)
        self.pacer = pacer if pacer is not None else Pacer()
        #: the read quota (readbacks, reconcile reads, status reads); unset: not paced
        self.read_pacer = read_pacer if read_pacer is not None else Pacer()
        #: this target's failures said again within a minute are logged once (issue 29)
        self.repeats = Repeats()

    def _rate_limited(self, exc: BaseException) -> float | None:
        """Let both pacers honour a RateLimited answer (to a write or a read: every later
        request waits); its retry_after (None: not one)."""
        if isinstance(exc, RateLimited):
            self.pacer.hold(exc.retry_after)
            if self.read_pacer is not self.pacer:
                self.read_pacer.hold(exc.retry_after)
            return exc.retry_after
        return None

    @staticmethod
    def map(event: LeadEvent) -> CRMRecord:
        return _crm_record().from_event(event)

    @property
    def dedupes(self) -> bool:
        """Whether the target deduplicates by write_id (SPEC E7): read at each use, as an
        adapter may learn it from its target (the HTTP target's ``identity``)."""
        return dedupes(self.adapter)

    @property
    def marks(self) -> bool:
        """Whether the target keeps batch marks (SPEC E8, ``runner.leads.marks``): read at
        each use, as the HTTP target learns it from its server's ``identity``."""
        return marks(self.adapter)

    @property
    def pinnable(self) -> bool:
        """Whether the adapter can name its target (it has ``target_id``)."""
        return callable(getattr(self.adapter, "target_id", None))

    async def identify(self) -> str | None:
        """The target's identity (None: not pinnable).  Never creates a target; raises
        what the adapter raises (the caller decides what a failure means)."""
        target_id = getattr(self.adapter, "target_id", None)
        if not callable(target_id):
            return None
        found = await anyio.to_thread.run_sync(target_id, abandon_on_cancel=True)
        return str(found) if found is not None else None

    async def prepare_writes(self, *, create: bool) -> None:
        """Let the adapter check that writes can start (creating the target only with
        ``create``); a no-op for an adapter without ``prepare_writes``."""
        prepare = getattr(self.adapter, "prepare_writes", None)
        if callable(prepare):
            await anyio.to_thread.run_sync(prepare, create, abandon_on_cancel=True)

    async def write(self, event: LeadEvent, write_id: str) -> None:
        record = self.map(event)
        await anyio.to_thread.run_sync(self.adapter.write, record, write_id,
                                       abandon_on_cancel=True)

    async def read_back(self, write_id: str) -> list[TargetRow]:
        await self.read_pacer.take()
        try:
            rows = await anyio.to_thread.run_sync(self.adapter.read_back, write_id,
                                                  abandon_on_cancel=True)
        except RateLimited as exc:
            self._rate_limited(exc)
            raise
        return list(rows)

    @property
    def reads_many(self) -> bool:
        """Whether the adapter reads many write_ids in one request (``read_back_many``)."""
        return callable(getattr(self.adapter, "read_back_many", None))

    def read_size(self, wanted: int) -> int:
        """write_ids per ``read_back_many`` request for a wanted number: at most the
        adapter's ``max_batch`` and its ``max_read``."""
        for limit in (self.max_batch, self.max_read):
            if limit is not None:
                wanted = min(wanted, limit)
        return max(wanted, 1)

    def status_size(self, wanted: int) -> int:
        """write_ids per ``observe_status`` request for a wanted number: at most the
        adapter's ``max_read``."""
        return max(wanted if self.max_read is None else min(wanted, self.max_read), 1)

    async def read_back_many(self, write_ids: Sequence[str]) -> dict[str, list[TargetRow]]:
        """The rows of many write_ids, grouped by write_id: one request (one read token)
        per ``read_size`` write_ids, so a caller may ask for any number (an adapter
        without ``read_back_many``: one paced ``read_back`` each).  A failed request
        raises; what earlier requests found is then not returned (a read proves nothing
        unless it is whole)."""
        if not self.reads_many:
            return {w: await self.read_back(w) for w in write_ids}
        by_id: dict[str, list[TargetRow]] = {w: [] for w in write_ids}
        size = self.read_size(len(by_id))
        ids = list(by_id)  # each write_id once
        for start in range(0, len(ids), size):
            await self.read_pacer.take()
            try:
                rows = await anyio.to_thread.run_sync(self._read_once, ids[start : start + size],
                                                      abandon_on_cancel=True)
            except RateLimited as exc:
                self._rate_limited(exc)
                raise
            for row in rows:
                if row.write_id in by_id:
                    by_id[row.write_id].append(row)
        return by_id

    def send_blocking(self, event: LeadEvent, write_id: str) -> SendResult:
        """Write, then read back (the L5 protocol), blocking: called from the dispatch
        run's worker thread (``runner.tasks.deliver``), which a cancellation abandons.

        ``not_sent`` only for ``BeforeWriteError``; ``failed`` for any other write error;
        ``unproven`` when the write returned but the readback failed (or the rows the
        write returned prove nothing); otherwise the verdict of the rows the write
        returned, or else of the readback.  Only ``match`` confirms.
        """
        record = self.map(event)
        try:
            given = self.adapter.write(record, write_id)
        except BeforeWriteError as exc:
            return _not_sent(exc, self._rate_limited(exc))
        except Exception as exc:  # noqa: BLE001 - may have been sent: the caller decides
            return _failed("failed", exc)
        crashpoints.hit("dispatch.after-write")
        found = written_rows(given, [write_id])
        if isinstance(found, str):
            return _unproven_rows(found)
        if found is not None:
            return SendResult(classify_readback(found[write_id], record, write_id))
        try:
            self.read_pacer.take_blocking()
            rows = self.adapter.read_back(write_id)
        except Exception as exc:  # noqa: BLE001 - written, but not proven
            self._rate_limited(exc)
            return _failed("unproven", exc)
        return SendResult(classify_readback(rows, record, write_id))

    def batch_size(self, wanted: int) -> int:
        """Records per request for a wanted batch size: at most the adapter's
        ``max_batch``."""
        return wanted if self.max_batch is None else min(wanted, self.max_batch)

    @property
    def batches(self) -> bool:
        """Whether the adapter takes many records in one request (``write_batch``); a
        wrapper may say it cannot (an attribute ``batches`` that is False)."""
        return (callable(getattr(self.adapter, "write_batch", None))
                and bool(getattr(self.adapter, "batches", True)))

    def send_batch_blocking(self, items: Sequence[tuple[LeadEvent, str]],
                            mark: BatchMark | None = None) -> list[SendResult]:
        """:meth:`send_blocking` for a batch in one request (``write_batch``), then one
        exact readback of every row of the batch (none when the write returned the rows);
        a result per item, in order.

        The request's outcome is the batch's: ``not_sent`` for all on ``BeforeWriteError``,
        ``failed`` for all on any other error, ``unproven`` for all when the readback
        failed.  Otherwise each record has its own readback verdict (a partial answer:
        some ``match``, some ``none``), and only ``match`` confirms.  Blocking, in the
        dispatch run's thread."""
        records = [(self.map(event), write_id) for event, write_id in items]
        n = len(records)
        write_batch = self.adapter.write_batch  # type: ignore[attr-defined]
        try:
            given = write_batch(records) if mark is None else write_batch(records, mark=mark)
        except BeforeWriteError as exc:
            return [_not_sent(exc, self._rate_limited(exc))] * n
        except Exception as exc:  # noqa: BLE001 - may have been sent: the caller decides
            return [_failed("failed", exc)] * n
        crashpoints.hit("dispatch.after-write")
        write_ids = [write_id for _, write_id in records]
        by_id = written_rows(given, write_ids)
        if isinstance(by_id, str):
            return [_unproven_rows(by_id)] * n
        if by_id is None:  # not given: read back
            try:
                self.read_pacer.take_blocking()
                rows = self._read_back_many(write_ids)
            except Exception as exc:  # noqa: BLE001 - written, but not proven
                self._rate_limited(exc)
                return [_failed("unproven", exc)] * n
            by_id = {}
            for row in rows:
                by_id.setdefault(row.write_id, []).append(row)
        return [SendResult(classify_readback(by_id.get(write_id, []), record, write_id))
                for record, write_id in records]

    def _read_back_many(self, write_ids: Sequence[str]) -> list[TargetRow]:
        """The rows of these write_ids, blocking, in requests of at most ``read_size``
        write_ids; the caller has taken the first request's read token, this takes one
        for each request after it."""
        if not self.reads_many:
            return [row for write_id in write_ids for row in self.adapter.read_back(write_id)]
        size = self.read_size(len(write_ids))
        rows: list[TargetRow] = []
        for start in range(0, len(write_ids), size):
            if start:
                self.read_pacer.take_blocking()
            rows.extend(self._read_once(write_ids[start : start + size]))
        return rows

    def _read_once(self, write_ids: Sequence[str]) -> list[TargetRow]:
        """One ``read_back_many`` request of the adapter."""
        return list(self.adapter.read_back_many(list(write_ids)))  # type: ignore[attr-defined]

    async def read_mark(self) -> TargetMark:
        """What the target keeps of batch marks (a target that keeps them)."""
        await self.read_pacer.take()
        return await anyio.to_thread.run_sync(
            self.adapter.read_mark, abandon_on_cancel=True)  # type: ignore[attr-defined]

    async def raise_mark(self, mark: BatchMark, replaces: str | None) -> TargetMark:
        """Raise the target's fence to ``mark`` with no rows (StaleMark, ForeignMark when
        it may not); the mark it replaced."""
        await self.pacer.take()
        try:
            replaced = await anyio.to_thread.run_sync(
                self.adapter.raise_mark, mark, replaces,  # type: ignore[attr-defined]
                abandon_on_cancel=True)
        except RateLimited as exc:
            self._rate_limited(exc)
            raise
        if not isinstance(replaced, TargetMark):
            raise TargetError(f"the adapter's raise_mark answered {type(replaced).__name__}, "
                              "not the TargetMark it replaced")
        return replaced

    async def read_by_keys(self, keys: Sequence[tuple[str, str]]) -> list[TargetRow]:
        """Every row held under one of these business keys, in requests of at most
        ``read_size`` keys."""
        rows: list[TargetRow] = []
        size = self.read_size(len(keys)) if keys else 1
        for start in range(0, len(keys), size):
            await self.read_pacer.take()
            chunk = list(keys[start : start + size])
            try:
                rows += await anyio.to_thread.run_sync(
                    self.adapter.read_by_keys, chunk,  # type: ignore[attr-defined]
                    abandon_on_cancel=True)
            except RateLimited as exc:
                self._rate_limited(exc)
                raise
        return rows

    async def confirm(self, event: LeadEvent, write_id: str) -> Readback:
        """Read back and classify (raises what the adapter raises)."""
        return classify_readback(await self.read_back(write_id), self.map(event), write_id)

    async def observe_status(self, write_ids: Sequence[str]) -> dict[str, Observation]:
        """Per write_id its status: one request (one read token) per ``status_size``
        write_ids; a write_id the adapter did not answer is a failed read.  A failed
        request raises (the caller decides what its write_ids' reads mean)."""
        ids = list(dict.fromkeys(write_ids))
        size = self.status_size(len(ids))
        found: dict[str, Observation] = {}
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            await self.read_pacer.take()
            try:
                seen = await anyio.to_thread.run_sync(self.adapter.observe_status, chunk,
                                                      abandon_on_cancel=True)
            except RateLimited as exc:
                self._rate_limited(exc)
                raise
            for w in chunk:
                found[w] = seen.get(w, ReadFailure("no answer for this record"))
        return found
