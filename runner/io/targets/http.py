"""The HTTP target adapter (issue 17): runner's target port over the documented protocol
(docs/reference/http-target.md), on httpx.

Blocking, like every adapter (runner calls it in a worker thread): one ``httpx.Client``
for the run, so connections are reused, with explicit connect, read, write and pool
timeouts.  What each outcome means is decided in one pure function
(:mod:`runner.io.targets.protocol`); this module only does the I/O and raises what it
returns.

Protocol version 2 (issue 29) is read from the server's ``identity``: a server that declares
``dedupes_write_id`` makes :attr:`HttpTarget.dedupes_write_id` true, and the rows a
version-2 append answer carries are returned by ``write_batch`` (and ``write``), so the
port confirms the batch from them without a ``read`` request.  Until the identity has
been read (runner reads it before any work), the adapter speaks version 1: no dedupe, and
an append's answer is never taken as rows.

Batch marks (issue 30) are learnt from the identity as well: a server that declares
``marks_batches`` makes :attr:`HttpTarget.marks_batches` true; a marked ``write_batch``
then carries the mark in its append (a ``409`` refusal is ``StaleMark`` / ``ForeignMark``),
and ``read_mark``, ``raise_mark`` and ``read_by_keys`` are ``GET BASE/mark``, ``POST
BASE/mark`` and ``POST BASE/read_keys``.  A server that does not declare it is never sent
a mark.

The bearer token is held in the client's default headers and nowhere else: it is never
logged, never part of an error message, and ``repr`` does not show it.  A URL with a user
name or password is refused (the token has its own file or variable).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from runner.errors import TargetUnavailable, UsageError
from runner.io.targets.protocol import (
    BadAnswer,
    Identity,
    append_rows,
    classify_answer,
    classify_append,
    classify_exception,
    key_json,
    mark_json,
    mark_refusal,
    parse_identity,
    parse_mark,
    parse_rows,
    parse_statuses,
    row_json,
)
from runner.leads.marks import BatchMark, Key, TargetMark
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Observation,
    RateLimited,
    ReadFailure,
    RejectedWrite,
    TargetReadError,
    TargetRow,
    observe_rows,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord

log = logging.getLogger("runner.target")

#: write_ids per read or status request (a batch readback of a big reconcile is chunked)
READ_CHUNK = 500


@dataclass(frozen=True)
class Timeouts:
    """Seconds: to connect, to read an answer, to write a request, to wait for a pooled
    connection."""

    connect: float = 5.0
    read: float = 10.0
    write: float = 10.0
    pool: float = 5.0


def check_url(url: str) -> str:
    """The base URL without a trailing slash; refuses what is not ``http(s)://HOST…`` or
    carries credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"--target: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--target: expected http://HOST[:PORT]/PATH or https://…")
    if parts.username is not None or parts.password is not None:
        raise UsageError("--target: a URL must not carry a user name or password; put the "
                         "token in --target-token-file or $RUNNER_TARGET_TOKEN")
    if parts.query or parts.fragment:
        raise UsageError("--target: the base URL takes no query or fragment")
    del port
    return url.rstrip("/")


class HttpTarget:
    """A CRM adapter over the HTTP target protocol."""

    def __init__(self, url: str, *, token: bytes | None = None,
                 timeouts: Timeouts | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = check_url(url)
        self.timeouts = timeouts or Timeouts()
        t = self.timeouts
        headers = {"accept": "application/json", "user-agent": "runner-http-target/1"}
        if token is not None:
            headers["authorization"] = "Bearer " + token.decode("ascii")
        self._client = httpx.Client(
            timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            # below the reference server's keep-alive (5 s): a connection the server is
            # about to close is not reused (its close would look like a drop after sending)
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4,
                                keepalive_expiry=2.0),
            headers=headers, follow_redirects=False, transport=transport)
        #: the server's identity, once read (None: not yet; version 1 is assumed)
        self.identity: Identity | None = None

    def __repr__(self) -> str:
        return f"HttpTarget({self.url!r})"

    def close(self) -> None:
        self._client.close()

    # -- calls --------------------------------------------------------------------------

    def _post(self, path: str, doc: Any) -> httpx.Response:
        return self._client.post(f"{self.url}/{path}", json=doc)

    def _read(self, path: str, doc: Any) -> Any:
        """A read call's JSON answer (a POST with ``doc``; None: a GET); any failure is
        TargetReadError."""
        try:
            answer = (self._client.get(f"{self.url}/{path}") if doc is None
                      else self._post(path, doc))
        except httpx.HTTPError as exc:
            raise TargetReadError(f"target {path} failed: {type(exc).__name__}") from None
        if answer.status_code != 200:
            # a quota answer to a read is the pacer's business too (it holds every later
            # request until retry_after); it proves nothing about the rows either way
            error = classify_append(answer.status_code, answer.headers, answer.content, 0,
                                    datetime.now(UTC))
            if isinstance(error, RateLimited):
                raise RateLimited(f"target {path} answered {answer.status_code} (rate "
                                  "limited)", retry_after=error.retry_after)
            raise TargetReadError(f"target {path} answered {answer.status_code}")
        try:
            return answer.json()
        except ValueError:
            raise TargetReadError(f"target {path} answered something not JSON") from None

    # -- the port -----------------------------------------------------------------------

    @property
    def dedupes_write_id(self) -> bool:
        """Whether the server declared (protocol 2) that it deduplicates by write_id; False
        until its identity has been read."""
        return self.identity is not None and self.identity.dedupes_write_id

    @property
    def marks_batches(self) -> bool:
        """Whether the server declared (protocol 2) that it keeps batch marks; False
        until its identity has been read."""
        return self.identity is not None and self.identity.marks_batches

    def _check_marks(self) -> None:
        if not self.marks_batches:
            raise BeforeWriteError(f"the HTTP target {self.url} does not declare "
                                   "marks_batches (any more): a mark is never sent to it")

    def write(self, record: CRMRecord, write_id: str) -> Sequence[TargetRow] | None:
        return self.write_batch([(record, write_id)])

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]],
                    mark: BatchMark | None = None) -> Sequence[TargetRow] | None:
        """One append request for the whole batch (applied atomically by the target).
        Returns the rows a version-2 server answered with (every row it holds for each
        write_id of the batch); None: it gave none, so the batch is read back.  With
        ``mark`` (a server that declares marks only), the append carries it; a refusal
        is StaleMark or ForeignMark (nothing applied)."""
        write_ids = [write_id for _, write_id in items]
        body: dict[str, Any] = {
            "rows": [row_json(record, write_id) for record, write_id in items]}
        if mark is not None:
            self._check_marks()
            body["mark"] = mark_json(mark)
        try:
            answer = self._post("append", body)
        except Exception as exc:  # noqa: BLE001 - classified: only a sure "not sent" is safe
            raise classify_exception(exc) from None
        refused = mark_refusal(answer.status_code, answer.content) if mark else None
        if refused is not None:
            raise refused
        found = classify_answer(answer.status_code, answer.headers, answer.content,
                                len(items), datetime.now(UTC))
        if isinstance(found, RejectedWrite):
            # the records become failed-safe and are retried on the backoff schedule: the
            # target's reason is said once per request, so a person can fix the cause
            log.warning("%s", found.message, extra={"action": "target.rejected",
                                                    "count": len(items)})
        if isinstance(found, Exception):
            raise found
        if self.identity is None or not self.identity.rows_in_append:
            return None  # version 1: an append's answer is not the rows it stored
        rows = append_rows(found, write_ids)
        if isinstance(rows, Exception):
            raise rows
        return rows

    def read_mark(self) -> TargetMark:
        """The server's mark (``GET BASE/mark``); any failure is TargetReadError."""
        self._check_reads_marks()
        try:
            return parse_mark(self._read("mark", None))
        except BadAnswer as exc:
            raise TargetReadError(f"target mark answered badly: {exc}") from None

    def _check_reads_marks(self) -> None:
        if not self.marks_batches:
            raise TargetReadError(f"the HTTP target {self.url} does not declare "
                                  "marks_batches: it has no mark to read")

    def raise_mark(self, mark: BatchMark, replaces: str | None = None) -> TargetMark:
        """The fence alone (``POST BASE/mark``): refused as a batch is (StaleMark,
        ForeignMark), other failures classified as an append's; the mark it replaced (the
        answer's ``replaced``)."""
        self._check_marks()
        try:
            answer = self._post("mark", {"mark": mark_json(mark), "replaces": replaces})
        except Exception as exc:  # noqa: BLE001 - classified: only a sure "not sent" is safe
            raise classify_exception(exc) from None
        refused = mark_refusal(answer.status_code, answer.content)
        if refused is not None:
            raise refused
        if answer.status_code != 200:
            error = classify_append(answer.status_code, answer.headers, answer.content, 0,
                                    datetime.now(UTC))
            assert error is not None  # anything but 200 is an error
            raise error
        try:
            doc = json.loads(answer.content)
            return parse_mark(doc.get("replaced") if isinstance(doc, dict) else None)
        except (ValueError, BadAnswer) as exc:
            # raised, but what it replaced is not known: the caller must assume the worst
            raise AmbiguousWriteError(f"the fence's answer names no replaced mark: "
                                      f"{exc}") from None

    def read_by_keys(self, keys: Sequence[Key]) -> Sequence[TargetRow]:
        """Every row of these (tenant, source_lead_id) keys, whatever its write_id
        (``POST BASE/read_keys``, in chunks)."""
        self._check_reads_marks()
        rows: list[TargetRow] = []
        for start in range(0, len(keys), READ_CHUNK):
            chunk = [key_json(key) for key in keys[start : start + READ_CHUNK]]
            doc = self._read("read_keys", {"keys": chunk})
            try:
                rows.extend(parse_rows(doc))
            except BadAnswer as exc:
                raise TargetReadError(f"target read_keys answered badly: {exc}") from None
        return rows

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return self.read_back_many([write_id])

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        rows: list[TargetRow] = []
        for start in range(0, len(write_ids), READ_CHUNK):
            chunk = list(write_ids[start : start + READ_CHUNK])
            doc = self._read("read", {"write_ids": chunk})
            try:
                rows.extend(parse_rows(doc))
            except BadAnswer as exc:
                raise TargetReadError(f"target read answered badly: {exc}") from None
        return rows

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        out: dict[str, Observation] = {}
        for start in range(0, len(write_ids), READ_CHUNK):
            chunk = list(write_ids[start : start + READ_CHUNK])
            doc = self._read("status", {"write_ids": chunk})
            try:
                found = parse_statuses(doc, chunk)
            except BadAnswer as exc:
                raise TargetReadError(f"target status answered badly: {exc}") from None
            for write_id in chunk:
                statuses = found.get(write_id)
                out[write_id] = (ReadFailure("no answer for this record") if statuses is None
                                 else observe_rows(statuses))
        return out

    # -- identity and the check before writes ------------------------------------------

    def target_id(self) -> str:
        """The server's identity (``GET BASE/identity``); what it declares (its protocol
        version, ``dedupes_write_id``) is kept for the calls that follow, and forgotten
        while it cannot be read (version 1 is assumed again)."""
        self.identity = None
        try:
            answer = self._client.get(f"{self.url}/identity")
        except httpx.HTTPError as exc:
            raise TargetUnavailable(f"the HTTP target {self.url} cannot be reached "
                                    f"({type(exc).__name__})") from None
        if answer.status_code != 200:
            raise TargetUnavailable(f"the HTTP target {self.url} answered "
                                    f"{answer.status_code} to its identity request")
        try:
            doc = answer.json()
        except ValueError:
            doc = None
        try:
            self.identity = parse_identity(doc)
        except BadAnswer as exc:
            raise TargetUnavailable(f"the HTTP target {self.url} answered its identity "
                                    f"request with {exc}") from None
        return self.identity.target_id

    def prepare_writes(self, create: bool) -> None:
        """The server answers its identity with this token: writes can start.  A remote
        target is never created from here, whatever ``create`` says."""
        del create
        self.target_id()
