"""Accepting events into the durable inbox (SPEC L2, L3).

Validation is pure and happens before the store is touched, so a bad input leaves the
store exactly as it was (not even created).  The answer is given only after the commit.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio

from runner import crashpoints
from runner.clock import Clock
from runner.errors import BadInputError, StoreError
from runner.jsonio import MAX_DOCUMENT_BYTES, canonical, parse_object
from runner.leads.models import (
    LeadEvent,
    Scope,
    WriteId,
    plain_canonical,
    plain_event,
    validate_event,
)
from runner.storedata import AcceptItem, AcceptOutcome

if TYPE_CHECKING:  # runner.store (the store protocols) is for type checks only: it
    # imports every port's module, which ``accept`` has no use for at run time
    from runner.store import IntakeStore

log = logging.getLogger("runner.leads.intake")

Result = Literal["accepted", "duplicate", "rejected"]


@dataclass(frozen=True)
class AcceptResult:
    """The answer to one accept (L13): ``accepted`` and ``duplicate`` are success."""

    result: Result
    source_lead_id: str | None
    write_id: WriteId | None
    reason: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.result != "rejected"

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else BadInputError.exit_code

    def to_line(self) -> str:
        """``to_json()`` as one line of compact JSON (formatted directly: bulk intake
        writes one per record)."""
        key = "null" if self.source_lead_id is None else _string(self.source_lead_id)
        write_id = "null" if self.write_id is None else _string(self.write_id)
        reason = "" if self.reason is None else f',"reason":{_string(self.reason)}'
        return f'{{"result":"{self.result}","source_lead_id":{key},"write_id":{write_id}{reason}}}'

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "result": self.result,
            "source_lead_id": self.source_lead_id,
            "write_id": self.write_id,
        }
        if self.reason is not None:
            doc["reason"] = self.reason
        return doc


_string: Callable[[str], str] = json.encoder.encode_basestring


def rejected(data: Any, error: BadInputError) -> AcceptResult:
    """A rejection that names the record by key when the input had a usable one."""
    key = data.get("source_lead_id") if isinstance(data, Mapping) else None
    return AcceptResult(
        "rejected",
        key if isinstance(key, str) and key else None,
        None,
        reason=error.reason,
        message=error.message,
    )


def prepare(data: Mapping[str, Any] | LeadEvent, scope: Scope) -> tuple[LeadEvent, str]:
    """Validate an event against the scope and return it with its canonical JSON."""
    raw = data.model_dump(exclude_unset=True) if isinstance(data, LeadEvent) else dict(data)
    event = validate_event(raw, scope)
    return event, canonical(raw)


def answer(event: LeadEvent, outcome: AcceptOutcome) -> AcceptResult:
    """The answer to a committed accept (a conflict is a rejection, L3)."""
    key = event.source_lead_id
    if outcome.result == "conflict":
        message = "another record with different content was already accepted under this key"
        log.debug("record rejected: conflict",
                  extra={"action": "lead.rejected", "key": key, "reason": "conflict"})
        return AcceptResult("rejected", key, None, "conflict", message)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("record %s", outcome.result, extra={
            "action": f"lead.{outcome.result}", "key": key, "write_id": outcome.write_id})
    return AcceptResult(outcome.result, key, outcome.write_id)


@dataclass
class _Pending:
    item: AcceptItem
    outcome: AcceptOutcome | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.error is not None


class Intake:
    """Validates events and commits them; concurrent callers share commits.

    Group commit: while one caller's transaction is being committed, others queue; the
    next caller to find no commit running takes everything queued (up to ``max_batch``)
    into one transaction.  Each caller is answered only after the commit that holds its
    record, and gets exactly the answer a lone accept would have given.  Sequential
    callers see no difference (a group of one is one statement).
    """

    def __init__(
        self, store: IntakeStore, clock: Clock, scope: Scope, max_batch: int = 1000
    ) -> None:
        self.store, self.clock, self.scope = store, clock, scope
        self.max_batch = max_batch
        self._queue: list[_Pending] = []
        self._flushing = False
        self._flushed = anyio.Event()

    async def accept(self, data: Mapping[str, Any] | LeadEvent) -> AcceptResult:
        """Validate, then commit, then answer.  Bad input is a ``rejected`` answer, not
        an exception; store failures raise."""
        try:
            event, text = prepare(data, self.scope)
        except BadInputError as exc:
            log.debug("record rejected: %s", exc.message,
                      extra={"action": "lead.rejected", "reason": exc.reason})
            return rejected(data, exc)
        pending = _Pending(AcceptItem(event, text, new_write_id()))
        self._queue.append(pending)
        while not pending.done:
            if self._flushing:
                await self._flushed.wait()
            else:
                await self._flush()
        if pending.error is not None:
            raise pending.error
        assert pending.outcome is not None
        return answer(event, pending.outcome)

    async def _flush(self) -> None:
        self._flushing, self._flushed = True, anyio.Event()
        batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
        try:
            crashpoints.hit("accept.before-commit")
            outcomes = await self.store.accept_many([p.item for p in batch], self.clock.now())
            crashpoints.hit("accept.after-commit")
            for pending, outcome in zip(batch, outcomes, strict=True):
                pending.outcome = outcome
        except Exception as exc:  # noqa: BLE001 - every caller in the group gets the error
            for pending in batch:
                pending.error = exc
        finally:
            for pending in batch:
                if not pending.done:  # the committing caller was cancelled mid-commit
                    pending.error = StoreError(
                        "accept interrupted before its commit was confirmed; accept the "
                        "record again (a duplicate answer means it was stored)")
            self._flushing = False
            self._flushed.set()

    async def accept_batch(
        self, docs: Sequence[Mapping[str, Any] | BadInputError]
    ) -> list[AcceptResult]:
        """Accept a batch in one transaction (bulk intake); ``docs`` may hold parse errors
        in place of records.  Answers in input order, after the commit."""
        return await self.commit_batch(self.prepare_batch(docs))

    def prepare_batch(self, docs: Sequence[Mapping[str, Any] | BadInputError]) -> Batch:
        """Validate a batch (pure: no I/O), so the next batch can be validated while the
        previous one is being committed."""
        batch = Batch()
        ids = new_write_ids(len(docs))
        for doc, write_id in zip(docs, ids, strict=True):
            self._add(batch, doc, write_id)
        return batch

    def prepare_lines(self, lines: Sequence[bytes | BadInputError]) -> Batch:
        """``prepare_batch`` for the raw lines of an NDJSON input (bulk intake), each
        parsed strictly as a record (``runner.jsonio.parse_object``).

        A plain, valid, in-scope line is parsed and validated in one pass
        (``runner.leads.models.plain_event``, which returns an event only where the
        strict parse and ``validate_event`` would give the same one); every other line
        takes the exact path, so each answer and rejection reason is the one a lone
        accept gives."""
        batch = Batch()
        results, valid, scope = batch.results, batch.valid, self.scope
        ids = new_write_ids(len(lines))
        for line, write_id in zip(lines, ids, strict=True):
            if isinstance(line, BadInputError):
                self._add(batch, line, write_id)
                continue
            event = plain_event(line, scope, MAX_DOCUMENT_BYTES)
            if event is None:
                try:
                    doc: Mapping[str, Any] | BadInputError = parse_object(line, what="record")
                except BadInputError as exc:
                    doc = exc
                self._add(batch, doc, write_id)
                continue
            valid.append((len(results), event,
                          AcceptItem(event, plain_canonical(event), write_id)))
            results.append(None)
        if len(valid) == len(results):  # no rejection: the answers if all are new
            batch.accepted = "".join(
                [_accepted_line(v[1].source_lead_id, v[2].write_id) for v in valid])
        return batch

    def _add(self, batch: Batch, doc: Mapping[str, Any] | BadInputError,
             write_id: WriteId) -> None:
        if isinstance(doc, BadInputError):
            batch.results.append(rejected(None, doc))
            return
        try:
            event, text = prepare(doc, self.scope)
        except BadInputError as exc:
            batch.results.append(rejected(doc, exc))
            return
        batch.valid.append((len(batch.results), event, AcceptItem(event, text, write_id)))
        batch.results.append(None)

    async def commit_batch(self, batch: Batch) -> list[AcceptResult]:
        """Commit a prepared batch in one transaction; answers in input order."""
        outcomes = await self._commit(batch)
        results = list(batch.results)
        for (index, event, _), outcome in zip(batch.valid, outcomes, strict=True):
            results[index] = answer(event, outcome)
        return [r for r in results if r is not None]

    async def _commit(self, batch: Batch, store: IntakeStore | None = None
                      ) -> list[AcceptOutcome]:
        """The store's outcomes of a prepared batch's valid records, in one transaction
        between the accept crash points (on ``store``: another session of the same store,
        for bulk intake's lanes)."""
        crashpoints.hit("accept.before-commit")
        outcomes = await (store or self.store).accept_many([v[2] for v in batch.valid],
                                                           self.clock.now())
        crashpoints.hit("accept.after-commit")
        return outcomes

    async def commit_lines(
        self, batch: Batch, store: IntakeStore | None = None
    ) -> tuple[str, int, list[tuple[int, AcceptResult]]]:
        """``commit_batch`` for bulk intake: the answers as text, one line each
        (``AcceptResult.to_line``, newline-terminated) in input order, their number, and
        the rejections among them with their positions, in order (for their messages).
        An ``accepted`` line is formatted directly; when every record is accepted the
        text is the one ``prepare_lines`` made beforehand (``Batch.accepted``)."""
        outcomes = await self._commit(batch, store)
        quiet = not log.isEnabledFor(logging.DEBUG)  # else answer() logs each one
        if (quiet and batch.accepted is not None
                and all(o.result == "accepted" and o.write_id == v[2].write_id
                        for v, o in zip(batch.valid, outcomes, strict=True))):
            return batch.accepted, len(batch.valid), []
        results = list(batch.results)
        lines: list[str] = [r.to_line() if r is not None else "" for r in results]
        for (index, event, _), outcome in zip(batch.valid, outcomes, strict=True):
            if quiet and outcome.result == "accepted":
                lines[index] = _accepted_line(event.source_lead_id, outcome.write_id)[:-1]
            else:
                results[index] = result = answer(event, outcome)
                lines[index] = result.to_line()
        text = "".join([line + "\n" for line in lines])
        return text, len(lines), [(i, r) for i, r in enumerate(results)
                                  if r is not None and not r.ok]


@dataclass
class Batch:
    """A validated batch: answers for rejected inputs, and the valid ones to commit.

    ``accepted``, set by ``prepare_lines`` when no input was rejected, is the batch's
    answer text (one line each, newline-terminated) for the outcome where every record
    is accepted with its own write_id: formatted while the previous batch is being
    committed, so that between two commits only that check is left to do."""

    results: list[AcceptResult | None] = field(default_factory=list)
    valid: list[tuple[int, LeadEvent, AcceptItem]] = field(default_factory=list)
    accepted: str | None = None


def _accepted_line(source_lead_id: str, write_id: str) -> str:
    """``AcceptResult("accepted", …).to_line()`` and its newline, formatted directly."""
    return (f'{{"result":"accepted","source_lead_id":{_string(source_lead_id)},'
            f'"write_id":{_string(write_id)}}}\n')


def new_write_id() -> WriteId:
    return new_write_ids(1)[0]


def new_write_ids(n: int) -> list[WriteId]:
    """``n`` time-ordered (version 7 layout) UUIDs: the current Unix time in milliseconds
    (48 bits), then 74 random bits from one read of the OS's random source, formatted
    directly (bulk intake makes one per record).

    Time-ordered so that a new record's write_id lands at the right-hand edge of the
    write_id index instead of on a random page of it: at a million leads the random form
    made every insert touch a cold index page (issue 21). Records written before keep
    their version 4 ids; nothing reads the layout (a write_id is an opaque, unique string).
    """
    stamp = f"{time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF:012x}"
    head, mid = stamp[:8], stamp[8:]
    text = os.urandom(10 * n).hex()
    return [WriteId(f"{head}-{mid}-7{h[:3]}-{_VARIANT[h[3]]}{h[4:7]}-{h[7:19]}")
            for h in (text[i : i + 20] for i in range(0, 20 * n, 20))]


#: the RFC 4122 variant bits (10xx) applied to a random hex digit
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


async def accept(
    store: IntakeStore, clock: Clock, scope: Scope, data: Mapping[str, Any] | LeadEvent
) -> AcceptResult:
    """Accept one event (no grouping with other callers)."""
    return await Intake(store, clock, scope).accept(data)
