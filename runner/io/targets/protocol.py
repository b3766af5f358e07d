"""The HTTP target protocol's wire format and its failure classification (issue 17).

The protocol is documented on its own page (docs/reference/http-target.md).  This module
holds what both ends share (the JSON shapes of a row) and the one place an HTTP outcome
becomes runner's verdict: :func:`classify_append` for an append's answer, and
:func:`classify_exception` for a transport failure.  Both are pure: they take the
exception, or the status code, headers and body (and ``now`` for an HTTP-date
``Retry-After``), and return the error to raise (None: the append succeeded); no I/O, so a
table test walks every case.

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
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from runner.leads.models import CRMRecord
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RateLimited,
    RejectedWrite,
    TargetError,
    TargetRow,
)

PROTOCOL_VERSION = 1
FIELDS = ("tenant", "source", "source_lead_id", "is_test", "contact_alias")
#: the longest reason from a server's error body kept in an error message
MAX_REASON = 200
#: the longest Retry-After honoured, in seconds (a day): beyond it, a day
MAX_RETRY_AFTER = 86_400.0


def row_json(record: CRMRecord, write_id: str) -> dict[str, Any]:
    return {"write_id": write_id, "fields": record.fields()}


class BadAnswer(ValueError):
    """A server's answer is not what the protocol says."""


def parse_rows(doc: Any) -> list[TargetRow]:
    """The rows of a ``read`` answer; raises BadAnswer for anything malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise BadAnswer("a read answer without a rows list")
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
    if status == 200:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return _kind(AmbiguousWriteError(
                "the target answered 200 with a body that is not JSON"), "malformed")
        appended = doc.get("appended") if isinstance(doc, dict) else None
        if type(appended) is not int or appended != sent:
            return _kind(AmbiguousWriteError(
                f"the target answered 200 without appended={sent}"), "malformed")
        return None
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
