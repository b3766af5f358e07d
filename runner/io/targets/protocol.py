"""The HTTP target protocol's wire format and its failure classification (issues 17, 29).

The protocol is documented on its own page (docs/reference/http-target.md).  This module
holds what both ends share (the JSON shapes of a row, what an identity declares) and the
one place an HTTP outcome becomes runner's verdict: :func:`classify_append` for an
append's answer (with :func:`append_rows`, the rows a version-2 answer carries), and
:func:`classify_exception` for a transport failure.  All are pure: they take the
exception, or the status code, headers and body (and ``now`` for an HTTP-date
``Retry-After``), and return the error to raise (None: the append succeeded); no I/O, so a
table test walks every case.

Version 2 (issue 29) only adds: an identity may declare ``"protocol": 2`` and
``"dedupes_write_id": true`` (:func:`parse_identity`), and an append's answer may carry the
rows as stored (``"rows"``), which then prove the batch without a ``read`` request.  A
version-1 identity (``protocol`` 1 or absent) is read exactly as before: no dedupe, and
an append's answer is never taken as rows.

Batch marks (issue 30) are version 2 too: an identity may declare ``"marks_batches":
true``; then runner's append carries ``"mark": {"store_id", "seq"}``, a refused one is
answered ``409`` with ``{"refused": "stale_mark" | "foreign_mark", "held": {"owner",
"seq"}}`` (:func:`mark_refusal`: ``StaleMark`` / ``ForeignMark``, nothing applied), and
three calls read and raise the mark and read rows by key (:func:`parse_mark`).

The rule they encode (``docs/reference/http-target.md``, "What an answer means"):

* nothing was sent (connect failure or timeout, a pool timeout, a bad URL) ->
  ``BeforeWriteError``;
* ``429``, or ``503`` with ``Retry-After`` -> ``RateLimited`` (a ``BeforeWriteError``);
* ``400``/``422`` -> ``RejectedWrite`` (a ``BeforeWriteError``, with the server's reason);
* any other ``4xx`` -> ``BeforeWriteError`` (the protocol: a 4xx applies nothing);
* anything else -> ``AmbiguousWriteError`` (uncertain: reconciled by readback only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import httpx

from runner.leads.marks import BatchMark, ForeignMark, Key, StaleMark, TargetMark
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RateLimited,
    RejectedWrite,
    TargetError,
    TargetRow,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord

#: the version a server without the later declarations speaks
PROTOCOL_V1 = 1
#: the newest version runner knows (a server of a later version keeps its promises)
PROTOCOL_VERSION = 2
FIELDS = ("tenant", "source", "source_lead_id", "is_test", "contact_alias")
#: the longest reason from a server's error body kept in an error message
MAX_REASON = 200
#: the status a server answers a marked request it refuses by its mark with
MARK_REFUSED = 409
#: the largest seq a mark may carry (a signed 64-bit integer: SQL BIGINT, SQLite INTEGER)
MAX_SEQ = (1 << 63) - 1
#: the longest Retry-After honoured, in seconds (a day): beyond it, a day
MAX_RETRY_AFTER = 86_400.0


def row_json(record: CRMRecord, write_id: str) -> dict[str, Any]:
    return {"write_id": write_id, "fields": record.fields()}


class BadAnswer(ValueError):
    """A server's answer is not what the protocol says."""


def parse_rows(doc: Any, what: str = "a read answer") -> list[TargetRow]:
    """The rows of a ``read`` answer (or of an append's); raises BadAnswer for anything
    malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise BadAnswer(f"{what} without a rows list")
    rows = []
    for entry in doc["rows"]:
        if not isinstance(entry, dict):
            raise BadAnswer("a row that is not an object")
        write_id, fields, status = entry.get("write_id"), entry.get("fields"), \
            entry.get("status")
        if not isinstance(write_id, str) or not isinstance(fields, dict):
            raise BadAnswer("a row without a write_id or fields")
        if status is not None and not isinstance(status, str):
            raise BadAnswer("a row whose status is not a string")
        rows.append(TargetRow(write_id=write_id, fields=dict(fields), status=status))
    return rows


def mark_json(mark: BatchMark) -> dict[str, Any]:
    return {"store_id": mark.store_id, "seq": mark.seq}


def held_json(held: TargetMark) -> dict[str, Any]:
    return {"owner": held.owner, "seq": held.seq}


def key_json(key: Key) -> dict[str, str]:
    return {"tenant": key[0], "source_lead_id": key[1]}


def _seq(value: Any) -> int | None:
    """A seq of a JSON document (a whole number in [0, MAX_SEQ]; None: it is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        return None
    return value


def parse_mark(doc: Any) -> TargetMark:
    """A held mark (``{"owner": string or null, "seq": N}``: a ``GET BASE/mark`` answer,
    or the ``held`` of a refusal); raises BadAnswer for anything malformed."""
    if not isinstance(doc, dict):
        raise BadAnswer("a mark that is not a JSON object")
    owner, seq = doc.get("owner"), _seq(doc.get("seq"))
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise BadAnswer("a mark whose owner is not null or a non-empty string")
    if seq is None:
        raise BadAnswer("a mark whose seq is not a whole number from 0 to 2**63-1")
    if owner is None and seq != 0:
        raise BadAnswer("a mark of no owner with a seq")
    return TargetMark(owner, seq)


def parse_batch_mark(doc: Any) -> BatchMark:
    """A request's mark (``{"store_id": string, "seq": N}``); raises BadAnswer."""
    if not isinstance(doc, dict) or set(doc) != {"store_id", "seq"}:
        raise BadAnswer("a mark must be exactly {\"store_id\", \"seq\"}")
    store_id, seq = doc["store_id"], _seq(doc["seq"])
    if not isinstance(store_id, str) or not 0 < len(store_id) <= 200:
        raise BadAnswer("a mark's store_id must be a string of 1-200 characters")
    if seq is None:
        raise BadAnswer("a mark's seq must be a whole number from 0 to 2**63-1")
    return BatchMark(store_id, seq)


def mark_refusal(status: int, body: bytes) -> StaleMark | ForeignMark | None:
    """A marked request's answer refusing it by its mark (``409`` with ``refused`` and
    ``held``) as the error to raise; None for any other answer (a 409 without a readable
    refusal is a 4xx as any other: nothing was applied)."""
    if status != MARK_REFUSED:
        return None
    try:
        doc = json.loads(body)
        kind = doc.get("refused") if isinstance(doc, dict) else None
        held = parse_mark(doc.get("held")) if kind in ("stale_mark", "foreign_mark") \
            else None
    except (ValueError, UnicodeDecodeError, BadAnswer):
        return None
    if held is None:
        return None
    words = _reason(body)
    if kind == "stale_mark":
        return StaleMark(f"the target refused the batch as stale: {words}", held=held)
    return ForeignMark(f"the target refused the batch as another store's: {words}",
                       held=held)


@dataclass(frozen=True)
class Identity:
    """What a server's ``identity`` answer says: its id, its protocol version, and (from
    version 2) whether it deduplicates by write_id and whether it keeps batch marks."""

    target_id: str
    protocol: int = PROTOCOL_V1
    dedupes_write_id: bool = False
    marks_batches: bool = False

    @property
    def rows_in_append(self) -> bool:
        """Whether an append's answer may be taken as the rows it stored (version 2)."""
        return self.protocol >= 2


def parse_identity(doc: Any) -> Identity:
    """An ``identity`` answer; raises BadAnswer, with the one thing wrong, for anything
    malformed.  ``protocol`` absent is version 1; a version-1 identity declares nothing
    more (a ``dedupes_write_id`` or ``marks_batches`` there is not a member of version 1,
    and ignored); members a version does not define are ignored."""
    if not isinstance(doc, dict):
        raise BadAnswer("an identity that is not a JSON object")
    found = doc.get("target_id")
    if not isinstance(found, str) or not found:
        raise BadAnswer("no identity (a target_id string)")
    protocol = doc.get("protocol", PROTOCOL_V1)
    if isinstance(protocol, bool) or not isinstance(protocol, int) or protocol < 1:
        raise BadAnswer(f"a protocol that is not a positive whole number ({protocol!r:.40})")
    if protocol == PROTOCOL_V1:
        return Identity(found)
    dedupes = doc.get("dedupes_write_id", False)
    if not isinstance(dedupes, bool):
        raise BadAnswer(f"a dedupes_write_id that is not true or false ({dedupes!r:.40})")
    marked = doc.get("marks_batches", False)
    if not isinstance(marked, bool):
        raise BadAnswer(f"a marks_batches that is not true or false ({marked!r:.40})")
    return Identity(found, protocol, dedupes, marked)


def parse_statuses(doc: Any, write_ids: Sequence[str]) -> dict[str, list[str]]:
    """The statuses of a ``status`` answer, for the write_ids asked (one absent from the
    answer is left out: the caller counts it as a failed read)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("statuses"), dict):
        raise BadAnswer("a status answer without a statuses object")
    found: dict[str, list[str]] = {}
    for write_id in write_ids:
        value = doc["statuses"].get(write_id)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise BadAnswer("a status entry that is not a list of strings")
        found[write_id] = list(value)
    return found


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """``Retry-After``: delta-seconds or an HTTP date (RFC 9110 10.2.3); None when absent
    or unreadable.  Bounded to [0, a day]."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _reason(body: bytes) -> str:
    """The server's reason from an error body (``{"error", "message"}``), bounded and
    printable; never more than the server said."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        parts = [str(doc[k]) for k in ("error", "message") if isinstance(doc.get(k), str)]
        text = ": ".join(parts)
    else:
        text = body.decode("utf-8", errors="replace")
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text[:MAX_REASON] or "no reason given"


def classify_append(status: int, headers: Mapping[str, str], body: bytes, sent: int,
                    now: datetime) -> TargetError | None:
    """An append's answer -> the error to raise, or None: every row applied.

    ``headers`` with lower-case names; ``sent`` the number of rows in the request."""
    answer = classify_answer(status, headers, body, sent, now)
    return answer if isinstance(answer, TargetError) else None


def classify_answer(status: int, headers: Mapping[str, str], body: bytes, sent: int,
                    now: datetime) -> TargetError | dict[str, Any]:
    """:func:`classify_append`, but a success is the answer's JSON object (for
    :func:`append_rows`), so a big answer is decoded once."""
    if status == 200:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return _kind(AmbiguousWriteError(
                "the target answered 200 with a body that is not JSON"), "malformed")
        if not isinstance(doc, dict) or type(doc.get("appended")) is not int \
                or doc["appended"] != sent:
            return _kind(AmbiguousWriteError(
                f"the target answered 200 without appended={sent}"), "malformed")
        return doc
    retry_after = parse_retry_after(headers.get("retry-after"), now)
    if status == 429:
        return RateLimited("the target answered 429 (rate limited); nothing was applied",
                           retry_after=retry_after)
    if status == 503 and retry_after is not None:
        return RateLimited("the target answered 503 with Retry-After; nothing was applied",
                           retry_after=retry_after)
    if status in (400, 422):
        return RejectedWrite(f"the target rejected the request ({status}): {_reason(body)}")
    if 400 <= status < 500:
        return BeforeWriteError(f"the target refused the request ({status}): "
                                f"{_reason(body)}; nothing was applied")
    return _kind(AmbiguousWriteError(
        f"the target answered {status}; the rows may have been applied"),
        "server_error" if 500 <= status < 600 else "ambiguous")


def append_rows(doc: Mapping[str, Any], write_ids: Sequence[str]
                ) -> list[TargetRow] | TargetError | None:
    """The rows a version-2 append answer (already judged a success) says the target now
    holds for the request's write_ids: None when it carries none (runner reads them
    back); an ``AmbiguousWriteError`` when they are malformed or do not cover the request
    exactly (a write_id of the request without a row, or a row of another write_id), so
    the batch is reconciled by readback; else the rows, every one the target holds for
    each write_id (two rows for one are two entries: an ambiguous readback)."""
    if "rows" not in doc:
        return None
    try:
        rows = parse_rows(doc, "an append answer")
    except BadAnswer as exc:
        return _kind(AmbiguousWriteError(
            f"the target answered 200 with malformed rows: {exc}"), "malformed")
    asked = set(write_ids)
    held = {row.write_id for row in rows}
    if held != asked:
        lacking, other = len(asked - held), len(held - asked)
        return _kind(AmbiguousWriteError(
            f"the target answered 200 with rows that do not cover the request ({lacking} "
            f"write_id(s) without a row, {other} not in the request)"), "malformed")
    return rows


#: transport failures that happen before any byte of the request is written
_NOT_SENT: tuple[type[BaseException], ...] = (
    httpx.ConnectError,  # DNS failure, connection refused, TLS handshake failure
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)


def _kind(error: TargetError, failure: str) -> TargetError:
    """``error`` with its kind of failure (``TargetError.failure``)."""
    error.failure = failure
    return error


def classify_exception(exc: BaseException) -> TargetError:
    """A failure of the request itself -> the error to raise.  Only a failure that is
    certainly before the request was written is ``BeforeWriteError``; anything else
    (a read or write timeout, a reset or close after sending, an error of our own) may
    have reached the server.  Each carries its kind (``failure``): ``refused`` (nothing
    sent), ``timed_out``, ``dropped`` (the connection closed after sending) or
    ``failed``."""
    name = type(exc).__name__
    if isinstance(exc, _NOT_SENT):
        return _kind(BeforeWriteError(f"the request was not sent ({name})"), "refused")
    if isinstance(exc, httpx.TimeoutException):
        return _kind(AmbiguousWriteError(f"no answer within the timeout ({name}); the "
                                         "request may have reached the target"), "timed_out")
    if isinstance(exc, httpx.TransportError):
        return _kind(AmbiguousWriteError(f"the connection dropped after sending ({name}); "
                                         "the request may have reached the target"),
                     "dropped")
    return _kind(AmbiguousWriteError(f"the request may have reached the target ({name})"),
                 "failed")
