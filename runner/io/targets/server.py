"""The reference HTTP target server (``runner target-serve``, issue 17).

It speaks the HTTP target protocol (docs/reference/http-target.md) so that runner's HTTP
adapter meets a real remote service in the demo, the tests, the chaos run and the bench:
real loopback HTTP, real timeouts, real dropped connections.  Rows are stored with the
synthetic target (``runner.io.synthetic_target``: the same sheet, appended atomically),
so the rows a run made can be counted in the file.  By default it speaks protocol
version 1 and never deduplicates (a spreadsheet); with ``dedupe`` (``--dedupe``, issue
29) it speaks version 2: it deduplicates by write_id (within one append, across appends,
and under concurrent appends: one transaction looks up and appends), declares it in its
identity, and answers each append with the rows it holds for the request's write_ids.
With ``marks`` (``--marks``, issue 30) it speaks version 2 and keeps batch marks
(``runner.io.targets.marksheet``): it declares ``marks_batches``, judges the mark an
append carries in the transaction that applies its rows (``409`` with the held mark when
refused, nothing applied), and answers ``GET``/``POST BASE/mark`` and ``POST
BASE/read_keys``.

What makes it a *useful* server to test against is what it does on purpose:

* a request quota on appends (a token bucket; ``429`` with ``Retry-After`` beyond it),
* faults (:class:`FaultPlan`): latency; ``500``, ``503`` + ``Retry-After``, ``429`` or
  ``422`` before applying anything; applying then dropping the connection without an
  answer (the ambiguous case); applying then answering after a delay (past the client's
  read timeout); refusing connections; failing every ``read``; and, in version 2,
  applying then answering with rows that are incomplete or malformed.

A plain ASGI callable, served by uvicorn through ``runner.io.http.server.HttpServer``
(the protocol class below hands the app its connection's transport, which is how an
append is applied and then the connection dropped without a byte of answer).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError

from runner.errors import UsageError
from runner.io.http.server import _HeaderTimeoutProtocol
from runner.io.synthetic_target import SyntheticTarget
from runner.io.targets.marksheet import MarkedSheet
from runner.io.targets.protocol import (
    MARK_REFUSED,
    PROTOCOL_V1,
    PROTOCOL_VERSION,
    BadAnswer,
    held_json,
    parse_batch_mark,
)
from runner.leads.marks import BatchMark, ForeignMark, Key, StaleMark, TargetMark
from runner.leads.models import CRMRecord, describe_validation_error
from runner.leads.port import AmbiguousWriteError, BeforeWriteError, TargetRow

log = logging.getLogger("runner.target_server")

#: the largest request body read (larger: 413, nothing applied)
MAX_BODY = 8 << 20
#: rows per append, write_ids per read
MAX_ROWS = 5000
MAX_WRITE_ID = 200
TRANSPORT_KEY = "runner.transport"

# -- the quota -------------------------------------------------------------------------


def parse_quota(text: str) -> float:
    """``N/min`` or ``N/s`` -> requests per second."""
    count, sep, unit = text.partition("/")
    per = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0}
    try:
        n = float(count)
    except ValueError:
        n = math.nan
    if not sep or unit not in per or not math.isfinite(n) or n <= 0:
        raise UsageError(f"--quota {text!r}: expected N/min or N/s with N > 0")
    return n / per[unit]


class TokenBucket:
    """``rate`` requests per second, holding at most one second's worth, and at least two:
    a client that paces itself at the quota is not refused for arriving a few
    milliseconds early.  ``now`` is passed in: the rule is tested without sleeping."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(2.0, rate)
        self.tokens = self.capacity
        self.at = now

    def take(self, now: float) -> float | None:
        """Take a token: None if one was there, else the seconds until one will be."""
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate


# -- faults ----------------------------------------------------------------------------

FAULT_KINDS = ("latency", "error-before", "unavailable", "throttle", "reject",
               "drop-after-apply", "slow-after-apply", "refuse", "read-error",
               "rows-incomplete", "rows-malformed")
_NEEDS_SECONDS = ("latency", "slow-after-apply")
#: faults of an append's rows: only a version-2 server (``--dedupe``) answers with rows
ROWS_FAULTS = ("rows-incomplete", "rows-malformed")


@dataclass(frozen=True)
class Fault:
    kind: str
    seconds: float = 0.0
    probability: float = 1.0


def parse_fault(text: str) -> Fault:
    """``KIND[:SECONDS][@PROBABILITY]``."""
    rest, _, prob = text.partition("@")
    kind, _, secs = rest.partition(":")
    if kind not in FAULT_KINDS:
        raise UsageError(f"--fault {text!r}: unknown kind (known: {', '.join(FAULT_KINDS)})")
    try:
        probability = float(prob) if prob else 1.0
        seconds = float(secs) if secs else 0.0
    except ValueError:
        raise UsageError(f"--fault {text!r}: expected KIND[:SECONDS][@PROBABILITY]") from None
    if not 0.0 < probability <= 1.0:
        raise UsageError(f"--fault {text!r}: the probability must be in (0, 1]")
    if not math.isfinite(seconds) or not 0 <= seconds <= 3600:
        raise UsageError(f"--fault {text!r}: the seconds must be 0-3600")
    if kind in _NEEDS_SECONDS and not secs:
        raise UsageError(f"--fault {text!r}: {kind} needs :SECONDS")
    return Fault(kind, seconds, probability)


@dataclass
class FaultPlan:
    """The faults of a server; each draws its own chance per request."""

    faults: Sequence[Fault] = ()
    rng: random.Random = field(default_factory=random.Random)

    def drawn(self, kind: str) -> Fault | None:
        for fault in self.faults:
            if fault.kind == kind and (fault.probability >= 1.0
                                       or self.rng.random() < fault.probability):
                return fault
        return None

    def has(self, kind: str) -> bool:
        return any(f.kind == kind for f in self.faults)


# -- the app ---------------------------------------------------------------------------


class DropProtocol(_HeaderTimeoutProtocol):
    """uvicorn's protocol, handing the app its connection's transport (scope
    ``extensions``), so a fault can drop a connection without a byte of answer."""

    def on_headers_complete(self) -> None:
        scope: Any = self.scope
        scope.setdefault("extensions", {})[TRANSPORT_KEY] = self.transport
        super().on_headers_complete()


class _Answer(Exception):
    """An answer, raised from deep in a call to be sent by the app."""

    def __init__(self, status: int, doc: Any, headers: Mapping[str, str] | None = None):
        super().__init__(status)
        self.status, self.doc, self.headers = status, doc, dict(headers or {})


def _error(status: int, error: str, message: str,
           headers: Mapping[str, str] | None = None) -> _Answer:
    return _Answer(status, {"error": error, "message": message}, headers)


@dataclass
class Counters:
    """What the server did, for its log line at exit and the tests."""

    appends: int = 0
    rows: int = 0  # rows made (a deduplicated repeat makes none)
    reads: int = 0  # read requests answered with rows
    throttled: int = 0
    dropped: int = 0


class TargetServerApp:
    """The protocol's four calls over a synthetic target file; with ``dedupe``, protocol
    version 2 (deduplicating by write_id, rows in the append's answer)."""

    def __init__(self, sheet: SyntheticTarget, *, token: bytes | None = None,
                 quota: float | None = None, faults: FaultPlan | None = None,
                 dedupe: bool = False, marks: MarkedSheet | None = None) -> None:
        self.sheet = sheet
        self.dedupe = dedupe
        #: the sheet's marks (None: the server keeps none)
        self.marks = marks
        self._token = token
        self.bucket = TokenBucket(quota, time.monotonic()) if quota else None
        self.faults = faults or FaultPlan()
        self.counters = Counters()
        self._identity: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        try:
            latency = self.faults.drawn("latency")
            if latency is not None:
                await anyio.sleep(latency.seconds)
            await self._route(scope, receive, send)
        except _Answer as answer:
            await _send_json(send, answer.status, answer.doc, answer.headers)

    async def _route(self, scope: Any, receive: Any, send: Any) -> None:
        self._authorize(scope)
        call = scope["path"].rstrip("/").rpartition("/")[2]
        method = scope["method"]
        if call == "identity" and method == "GET":
            identity: dict[str, Any] = {"target_id": await self._target_id(),
                                        "protocol": PROTOCOL_V1}
            if self.dedupe:
                identity.update(protocol=PROTOCOL_VERSION, dedupes_write_id=True)
            if self.marks is not None:
                identity.update(protocol=PROTOCOL_VERSION, marks_batches=True)
            raise _Answer(200, identity)
        calls: tuple[str, ...] = ("append", "read", "status")
        if self.marks is not None:
            calls += ("mark", "read_keys")
        if call not in calls:
            raise _error(404, "not_found", f"no such call (identity, {', '.join(calls)})")
        if call == "mark" and method == "GET":
            assert self.marks is not None
            raise _Answer(200, held_json(await anyio.to_thread.run_sync(
                self.marks.read_mark)))
        if method != "POST":
            raise _error(405, "method_not_allowed", f"{call} takes POST")
        doc = await _read_json(receive)
        if call == "append":
            await self._append(scope, doc, receive)
            return
        if call == "mark":
            await self._raise_mark(doc)
            return
        if call == "read_keys":
            assert self.marks is not None
            found = await anyio.to_thread.run_sync(self.marks.read_by_keys, _keys(doc))
            self.counters.reads += 1
            raise _Answer(200, {"rows": _rows_json(found)})
        write_ids = _write_ids(doc)
        if call == "read":
            if self.faults.drawn("read-error") is not None:
                raise _error(500, "internal", "fault read-error: the rows were not read")
            rows = await anyio.to_thread.run_sync(self.sheet.read_back_many, write_ids)
            self.counters.reads += 1
            raise _Answer(200, {"rows": _rows_json(rows)})
        raise _Answer(200, {"statuses": await self._statuses(write_ids)})

    def _authorize(self, scope: Any) -> None:
        if self._token is None:
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, b"Bearer " + self._token):
            raise _error(401, "unauthorized", "a bearer token is required",
                         {"www-authenticate": "Bearer"})

    async def _target_id(self) -> str:
        if self._identity is None:
            self._identity = await anyio.to_thread.run_sync(self.sheet.target_id)
        return self._identity

    async def _statuses(self, write_ids: list[str]) -> dict[str, list[str]]:
        # the synthetic target folds rows into observations; the protocol gives facts
        rows = await anyio.to_thread.run_sync(self.sheet.read_back_many, write_ids)
        out: dict[str, list[str]] = {w: [] for w in write_ids}
        for row in rows:
            out[row.write_id].append(row.status or "")
        return out

    async def _raise_mark(self, doc: Any) -> None:
        """``POST BASE/mark``: the fence alone, judged as an append's mark is."""
        assert self.marks is not None
        mark = _mark(doc)
        replaces = doc.get("replaces")
        if replaces is not None and (not isinstance(replaces, str) or not replaces):
            raise _error(422, "invalid_request", "replaces must be null or a store_id")
        assert mark is not None
        try:
            replaced = await self._marked(self.marks.fence, mark, replaces)
        except BeforeWriteError as exc:
            raise _error(503, "unavailable", f"the sheet is busy: {exc.message}",
                         {"retry-after": "1"}) from None
        except AmbiguousWriteError as exc:
            raise _error(500, "internal", f"the mark write failed: {exc.message}") from None
        raise _Answer(200, {**held_json(TargetMark(mark.store_id, mark.seq)),
                            "replaced": held_json(replaced)})

    async def _marked(self, call: Any, *args: Any, **kw: Any) -> Any:
        """A marked write in a worker thread; a refusal by its mark is the 409 answer."""
        try:
            return await anyio.to_thread.run_sync(lambda: call(*args, **kw))
        except (StaleMark, ForeignMark) as exc:
            raise _Answer(MARK_REFUSED, {"error": exc.reason, "refused": exc.reason,
                                         "message": exc.message,
                                         "held": held_json(exc.held)}) from None

    async def _append(self, scope: Any, doc: Any, receive: Any) -> None:
        items = _rows(doc)
        mark = _mark(doc) if self.marks is not None and "mark" in doc else None
        if self.bucket is not None:
            wait = self.bucket.take(time.monotonic())
            if wait is not None:
                self.counters.throttled += 1
                raise _error(429, "rate_limited", "the append quota is used up",
                             {"retry-after": str(max(1, math.ceil(wait)))})
        for kind, status, error in (("throttle", 429, "rate_limited"),
                                    ("unavailable", 503, "unavailable"),
                                    ("reject", 422, "rejected"),
                                    ("error-before", 500, "internal")):
            if self.faults.drawn(kind) is not None:
                if kind == "throttle":
                    self.counters.throttled += 1
                headers = {"retry-after": "1"} if status in (429, 503) else None
                raise _error(status, error, f"fault {kind}: nothing was applied", headers)
        held: list[TargetRow] = []
        try:
            if mark is not None:
                assert self.marks is not None
                made, held = await self._marked(self.marks.append, items, mark,
                                                once=self.dedupe)
            elif self.dedupe:
                made, held = await anyio.to_thread.run_sync(self.sheet.write_batch_once,
                                                            items)
            else:
                await anyio.to_thread.run_sync(self.sheet.write_batch, items)
                made = len(items)
        except BeforeWriteError as exc:
            raise _error(503, "unavailable", f"the sheet is busy: {exc.message}",
                         {"retry-after": "1"}) from None
        except AmbiguousWriteError as exc:
            raise _error(500, "internal", f"the sheet write failed: {exc.message}") from None
        self.counters.appends += 1
        self.counters.rows += made
        if self.faults.drawn("drop-after-apply") is not None:
            self.counters.dropped += 1
            transport = scope.get("extensions", {}).get(TRANSPORT_KEY)
            if transport is not None:
                transport.abort()
                # no answer at all: wait until uvicorn has seen the connection go
                with anyio.move_on_after(1):
                    await receive()
            return
        slow = self.faults.drawn("slow-after-apply")
        if slow is not None:
            await anyio.sleep(slow.seconds)
        if not self.dedupe:
            raise _Answer(200, {"appended": len(items)})  # version 1
        # version 2: every row held for each write_id of the request, after applying
        rows = _rows_json(held)
        if self.faults.drawn("rows-incomplete") is not None:
            rows = [row for row in rows if row["write_id"] != items[-1][1]]
        if self.faults.drawn("rows-malformed") is not None:
            rows[0]["fields"] = "not an object"
        raise _Answer(200, {"appended": len(items), "rows": rows})


def _rows_json(rows: Sequence[TargetRow]) -> list[dict[str, Any]]:
    return [{"write_id": r.write_id, "fields": dict(r.fields), "status": r.status}
            for r in rows]


async def _send_json(send: Any, status: int, doc: Any, headers: Mapping[str, str]) -> None:
    body = json.dumps(doc, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _read_json(receive: Any) -> Any:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _error(400, "disconnected", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _error(413, "too_large", f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError):
        raise _error(400, "invalid_json", "the body is not JSON") from None


def _write_id(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_WRITE_ID:
        raise _error(422, "invalid_write_id",
                     f"a write_id must be a string of 1-{MAX_WRITE_ID} characters")
    return value


def _write_ids(doc: Any) -> list[str]:
    ids = doc.get("write_ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or len(ids) > MAX_ROWS:
        raise _error(422, "invalid_request", f"expected {{\"write_ids\": [...]}} with at most "
                                             f"{MAX_ROWS} write_ids")
    return [_write_id(w) for w in ids]


def _mark(doc: Any) -> BatchMark | None:
    """A request's ``mark`` (422 when malformed)."""
    try:
        return parse_batch_mark(doc.get("mark") if isinstance(doc, dict) else None)
    except BadAnswer as exc:
        raise _error(422, "invalid_mark", str(exc)) from None


def _keys(doc: Any) -> list[Key]:
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list) or len(keys) > MAX_ROWS:
        raise _error(422, "invalid_request", f"expected {{\"keys\": [...]}} with at most "
                                             f"{MAX_ROWS} keys")
    found: list[Key] = []
    for key in keys:
        if not isinstance(key, dict) or set(key) != {"tenant", "source_lead_id"} or not all(
                isinstance(v, str) for v in key.values()):
            raise _error(422, "invalid_key",
                         "a key is exactly {\"tenant\": string, \"source_lead_id\": string}")
        found.append((key["tenant"], key["source_lead_id"]))
    return found


def _rows(doc: Any) -> list[tuple[CRMRecord, str]]:
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_ROWS:
        raise _error(422, "invalid_request",
                     f"expected {{\"rows\": [...]}} with 1-{MAX_ROWS} rows")
    items = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != {"write_id", "fields"}:
            raise _error(422, "invalid_row", f"row {i}: expected write_id and fields")
        write_id = _write_id(row["write_id"])
        try:
            record = CRMRecord.model_validate(row["fields"])
        except ValidationError as exc:
            raise _error(422, "invalid_row",
                         f"row {i}: {describe_validation_error(exc)}") from None
        items.append((record, write_id))
    return items


def open_sheet(path: str) -> SyntheticTarget:
    """The server's sheet, created if absent (the server owns its file)."""
    sheet = SyntheticTarget(path)
    sheet.prepare_writes(create=True)
    return sheet
