"""The HTTP target's pure rules, case by case (issues 17, 29): failure classification of
an append's answer and of a transport failure, ``Retry-After``, the wire shapes, what a
version-2 identity declares and what the rows of a version-2 append answer prove, the
reference server's quota and fault syntax.  The same rules on real loopback HTTP:
tests/test_http_target.py and tests/test_http_target_v2.py."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime

import httpx
import pytest

from runner.commands.common import read_target_token
from runner.errors import UsageError
from runner.io.targets.compose import load_factory
from runner.io.targets.http import check_url
from runner.io.targets.protocol import (
    BadAnswer,
    Identity,
    append_rows,
    classify_answer,
    classify_append,
    classify_exception,
    parse_identity,
    parse_retry_after,
    parse_rows,
    parse_statuses,
)
from runner.io.targets.server import TokenBucket, parse_fault, parse_quota
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RateLimited,
    RejectedWrite,
)

pytestmark = pytest.mark.timeout(30)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
OK = b'{"appended": 2}'

# status, headers, body -> the class raised (None: success), retry_after when RateLimited
APPEND_CASES = [
    (200, {}, OK, None, None),
    (200, {}, b'{"appended": 1}', AmbiguousWriteError, None),  # fewer rows than sent
    (200, {}, b'{"appended": 3}', AmbiguousWriteError, None),
    (200, {}, b'{"appended": "2"}', AmbiguousWriteError, None),
    (200, {}, b'{"appended": true}', AmbiguousWriteError, None),
    (200, {}, b"[2]", AmbiguousWriteError, None),
    (200, {}, b"not json", AmbiguousWriteError, None),
    (200, {}, b"", AmbiguousWriteError, None),
    (200, {}, b"\xff\xfe", AmbiguousWriteError, None),
    (201, {}, OK, AmbiguousWriteError, None),
    (204, {}, b"", AmbiguousWriteError, None),
    (301, {"location": "/x"}, b"", AmbiguousWriteError, None),
    (429, {}, b"", RateLimited, None),
    (429, {"retry-after": "7"}, b"", RateLimited, 7.0),
    (429, {"retry-after": "0.5"}, b"", RateLimited, 0.5),
    (429, {"retry-after": "-3"}, b"", RateLimited, 0.0),
    (429, {"retry-after": "99999999"}, b"", RateLimited, 86_400.0),
    (429, {"retry-after": "Mon, 30 Nov 2026 12:00:30 GMT"}, b"", RateLimited, 30.0),
    (429, {"retry-after": "soon"}, b"", RateLimited, None),
    (429, {"retry-after": "nan"}, b"", RateLimited, None),
    (503, {"retry-after": "2"}, b"", RateLimited, 2.0),
    (503, {"retry-after": "Mon, 30 Nov 2026 11:59:00 GMT"}, b"", RateLimited, 0.0),
    (503, {}, b"", AmbiguousWriteError, None),  # no Retry-After: may have been applied
    (503, {"retry-after": "later"}, b"", AmbiguousWriteError, None),
    (400, {}, b'{"error": "invalid_json", "message": "the body is not JSON"}',
     RejectedWrite, None),
    (422, {}, b'{"error": "invalid_row", "message": "row 0: tenant"}', RejectedWrite, None),
    (422, {}, b"plain text reason", RejectedWrite, None),
    (401, {}, b"", BeforeWriteError, None),
    (403, {}, b"", BeforeWriteError, None),
    (404, {}, b"", BeforeWriteError, None),
    (408, {}, b"", BeforeWriteError, None),
    (413, {}, b"", BeforeWriteError, None),
    (500, {}, b"", AmbiguousWriteError, None),
    (502, {}, b"", AmbiguousWriteError, None),
    (504, {}, b"", AmbiguousWriteError, None),
    (599, {}, b"", AmbiguousWriteError, None),
    (100, {}, b"", AmbiguousWriteError, None),
]


@pytest.mark.parametrize(("status", "headers", "body", "expected", "retry_after"),
                         APPEND_CASES)
def test_an_append_answer_is_classified_by_the_documented_table(
        status, headers, body, expected, retry_after) -> None:
    error = classify_append(status, headers, body, 2, NOW)
    if expected is None:
        assert error is None
        return
    assert type(error) is expected
    if isinstance(error, RateLimited):
        assert error.retry_after == retry_after


def test_only_4xx_answers_allow_another_send() -> None:
    """The protocol's promise, over every status code: an answer lets the records be sent
    again (a BeforeWriteError) exactly when it is a 4xx, or a 503 with Retry-After."""
    for status in range(100, 600):
        for headers in ({}, {"retry-after": "1"}):
            error = classify_append(status, headers, b"{}", 1, NOW)
            allowed = 400 <= status < 500 or (status == 503 and headers)
            assert isinstance(error, BeforeWriteError) == bool(allowed), (status, headers)


def test_a_rejection_carries_the_servers_reason_bounded_and_printable() -> None:
    error = classify_append(422, {}, b'{"error": "invalid_row", "message": "row 3: tenant"}',
                            1, NOW)
    assert isinstance(error, RejectedWrite) and error.reason == "rejected"
    assert "invalid_row: row 3: tenant" in error.message
    long = classify_append(400, {}, b"x\x00" * 1000, 1, NOW)
    assert long is not None and "\x00" not in long.message and len(long.message) < 300


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://127.0.0.1:9/sheet/append")


EXCEPTION_CASES = [
    (httpx.ConnectError("[Errno 111] Connection refused", request=_request()),
     BeforeWriteError),
    (httpx.ConnectError("[Errno -2] Name or service not known", request=_request()),
     BeforeWriteError),
    (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]", request=_request()),
     BeforeWriteError),
    (httpx.ConnectTimeout("timed out", request=_request()), BeforeWriteError),
    (httpx.PoolTimeout("timed out", request=_request()), BeforeWriteError),
    (httpx.UnsupportedProtocol("ftp"), BeforeWriteError),
    (httpx.InvalidURL("bad"), BeforeWriteError),
    (httpx.ReadTimeout("timed out", request=_request()), AmbiguousWriteError),
    (httpx.WriteTimeout("timed out", request=_request()), AmbiguousWriteError),
    (httpx.ReadError("reset", request=_request()), AmbiguousWriteError),
    (httpx.WriteError("broken pipe", request=_request()), AmbiguousWriteError),
    (httpx.RemoteProtocolError("Server disconnected without sending a response.",
                               request=_request()), AmbiguousWriteError),
    (httpx.LocalProtocolError("bad"), AmbiguousWriteError),
    (httpx.DecodingError("bad gzip"), AmbiguousWriteError),
    (ssl.SSLError("after the handshake"), AmbiguousWriteError),
    (ConnectionResetError(104, "reset"), AmbiguousWriteError),
    (RuntimeError("a bug"), AmbiguousWriteError),
]


@pytest.mark.parametrize(("exc", "expected"), EXCEPTION_CASES,
                         ids=[type(e).__name__ for e, _ in EXCEPTION_CASES])
def test_a_transport_failure_is_before_write_only_when_nothing_was_sent(exc, expected) -> None:
    assert type(classify_exception(exc)) is expected


def test_no_error_message_echoes_the_request() -> None:
    exc = httpx.ReadTimeout("timed out", request=_request())
    assert "9/sheet" not in classify_exception(exc).message


def test_retry_after_reads_seconds_and_dates() -> None:
    assert parse_retry_after(None, NOW) is None
    assert parse_retry_after(" 12 ", NOW) == 12.0
    assert parse_retry_after("Mon, 30 Nov 2026 12:01:00 GMT", NOW) == 60.0
    assert parse_retry_after("", NOW) is None


def test_read_answers_are_checked_before_they_are_believed() -> None:
    row = {"write_id": "w", "fields": {"tenant": "t"}, "status": "new"}
    assert parse_rows({"rows": [row]})[0].write_id == "w"
    for bad in ({}, {"rows": {}}, {"rows": [1]}, {"rows": [{"write_id": 3, "fields": {}}]},
                {"rows": [{"write_id": "w", "fields": []}]},
                {"rows": [{"write_id": "w", "fields": {}, "status": 7}]}, []):
        with pytest.raises(BadAnswer):
            parse_rows(bad)
    assert parse_statuses({"statuses": {"a": ["new"], "b": []}}, ["a", "b", "c"]) == {
        "a": ["new"], "b": []}
    for bad in ({}, {"statuses": []}, {"statuses": {"a": "new"}}, {"statuses": {"a": [1]}}):
        with pytest.raises(BadAnswer):
            parse_statuses(bad, ["a"])


@pytest.mark.parametrize("url", [
    "ftp://host/x", "http://", "http://user:pw@host/x", "http://tok@host/x",
    "http://host/x?token=1", "http://host:99999/x", "sheet.db",
])
def test_a_target_url_that_cannot_be_used_is_refused(url) -> None:
    with pytest.raises(UsageError):
        check_url(url)


def test_a_good_target_url_loses_its_trailing_slash() -> None:
    assert check_url("https://crm.example/api/v1/") == "https://crm.example/api/v1"


def test_the_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"s3cret-token\n")
    monkeypatch.setenv("RUNNER_TARGET_TOKEN", "from-env")
    assert read_target_token(str(path)) == b"s3cret-token"
    assert read_target_token(None) == b"from-env"
    monkeypatch.delenv("RUNNER_TARGET_TOKEN")
    assert read_target_token(None) is None
    for bad in (b"", b"  \n", b"two words", b"x" * 5000):
        path.write_bytes(bad)
        with pytest.raises(UsageError) as caught:
            read_target_token(str(path))
        assert "two" not in caught.value.message
    with pytest.raises(UsageError):
        read_target_token(str(tmp_path / "absent"))


@pytest.mark.parametrize("spec", ["nocolon", ":f", "m:", "no_such_module_x:f",
                                  "runner.io.targets.compose:no_such",
                                  "runner.io.targets.compose:__name__"])
def test_a_bad_adapter_spec_is_a_usage_error(spec) -> None:
    with pytest.raises(UsageError):
        load_factory(spec)


def test_the_quota_is_a_token_bucket_of_one_seconds_worth_at_least_two() -> None:
    assert parse_quota("60/min") == 1.0
    assert parse_quota("5/s") == 5.0
    for bad in ("60", "0/min", "-1/s", "x/min", "60/week", "nan/s", "inf/s"):
        with pytest.raises(UsageError):
            parse_quota(bad)
    bucket = TokenBucket(1.0, now=0.0)
    assert bucket.take(0.0) is None and bucket.take(0.0) is None  # two: jitter room
    assert bucket.take(0.0) == pytest.approx(1.0)
    assert bucket.take(0.5) == pytest.approx(0.5)
    assert bucket.take(1.0) is None
    assert bucket.take(1.0) == pytest.approx(1.0)
    # sustained: one a second, whatever the demand
    steady = TokenBucket(1.0, now=0.0)
    granted = sum(steady.take(t / 10) is None for t in range(1000))
    assert granted == 2 + 99
    fast = TokenBucket(10.0, now=0.0)
    assert [fast.take(0.0) is None for _ in range(11)].count(True) == 10


def test_fault_specs_are_checked() -> None:
    assert parse_fault("drop-after-apply").probability == 1.0
    fault = parse_fault("slow-after-apply:5@0.25")
    assert (fault.kind, fault.seconds, fault.probability) == ("slow-after-apply", 5.0, 0.25)
    for bad in ("explode", "latency", "latency:x", "throttle@0", "throttle@1.5",
                "latency:-1", "latency:nan"):
        with pytest.raises(UsageError):
            parse_fault(bad)


# -- protocol version 2 (issue 29) ------------------------------------------------------

IDENTITY_CASES = [
    ({"target_id": "t"}, Identity("t", 1, False)),
    ({"target_id": "t", "protocol": 1}, Identity("t", 1, False)),
    # a v1 identity declares nothing more: its dedupes_write_id is not a v1 member
    ({"target_id": "t", "protocol": 1, "dedupes_write_id": True}, Identity("t", 1, False)),
    ({"target_id": "t", "protocol": 1, "dedupes_write_id": "yes"}, Identity("t", 1, False)),
    ({"target_id": "t", "protocol": 2}, Identity("t", 2, False)),
    ({"target_id": "t", "protocol": 2, "dedupes_write_id": False}, Identity("t", 2, False)),
    ({"target_id": "t", "protocol": 2, "dedupes_write_id": True}, Identity("t", 2, True)),
    # a later version keeps the promises of version 2; unknown members are ignored
    ({"target_id": "t", "protocol": 3, "dedupes_write_id": True, "keeps": {"x": 1}},
     Identity("t", 3, True)),
]


@pytest.mark.parametrize(("doc", "expected"), IDENTITY_CASES)
def test_an_identity_declares_its_protocol_and_dedupe(doc, expected) -> None:
    assert parse_identity(doc) == expected


@pytest.mark.parametrize(("doc", "said"), [
    (None, "not a JSON object"), ([], "not a JSON object"), ({}, "target_id"),
    ({"target_id": ""}, "target_id"), ({"target_id": 7}, "target_id"),
    ({"target_id": "t", "protocol": "2"}, "protocol"),
    ({"target_id": "t", "protocol": True}, "protocol"),
    ({"target_id": "t", "protocol": 0}, "protocol"),
    ({"target_id": "t", "protocol": 2.0}, "protocol"),
    ({"target_id": "t", "protocol": 2, "dedupes_write_id": "true"}, "dedupes_write_id"),
    ({"target_id": "t", "protocol": 2, "dedupes_write_id": 1}, "dedupes_write_id"),
    ({"target_id": "t", "protocol": 2, "dedupes_write_id": None}, "dedupes_write_id"),
])
def test_a_malformed_identity_is_one_clear_error(doc, said) -> None:
    with pytest.raises(BadAnswer) as caught:
        parse_identity(doc)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def _stored(write_id: str, **fields: object) -> dict[str, object]:
    return {"write_id": write_id, "fields": {"tenant": "t", **fields}, "status": "new"}


def test_v2_rows_in_an_append_answer_prove_the_request_exactly() -> None:
    ids = ["w-1", "w-2"]
    assert append_rows({"appended": 2}, ids) is None  # none given: read back
    found = append_rows({"appended": 2, "rows": [_stored("w-2"), _stored("w-1")]}, ids)
    assert isinstance(found, list) and sorted(r.write_id for r in found) == ids
    # two rows for one write_id are two entries: the port's readback verdict says
    # "ambiguous" for that record (never confirmed)
    twice = append_rows({"appended": 2, "rows": [_stored("w-1"), _stored("w-1"),
                                                 _stored("w-2")]}, ids)
    assert isinstance(twice, list) and len(twice) == 3
    # a repeated write_id within the request is covered by its one row
    assert isinstance(append_rows({"appended": 2, "rows": [_stored("w-1")]},
                                  ["w-1", "w-1"]), list)


@pytest.mark.parametrize("rows", [
    [_stored("w-1")],  # w-2 without a row: incomplete
    [],
    [_stored("w-1"), _stored("w-2"), _stored("w-3")],  # a row of another write_id
    {"w-1": []}, "rows", None, [1], [{"write_id": "w-1"}, _stored("w-2")],
    [{"write_id": "w-1", "fields": "x", "status": "new"}, _stored("w-2")],
    [{**_stored("w-1"), "status": 5}, _stored("w-2")],
])
def test_v2_rows_that_are_malformed_or_incomplete_are_ambiguous(rows) -> None:
    error = append_rows({"appended": 2, "rows": rows}, ["w-1", "w-2"])
    assert type(error) is AmbiguousWriteError


def test_a_v2_answer_is_judged_as_a_v1_answer_first() -> None:
    body = b'{"appended": 1, "rows": [], "created": 0, "later": {"x": 1}}'
    # unknown members are ignored; appended must still be the rows sent
    assert classify_answer(200, {}, body, 1, NOW) == {
        "appended": 1, "rows": [], "created": 0, "later": {"x": 1}}
    assert classify_append(200, {}, body, 1, NOW) is None
    assert type(classify_answer(200, {}, body, 2, NOW)) is AmbiguousWriteError
    assert type(classify_answer(500, {}, body, 1, NOW)) is AmbiguousWriteError


def test_the_rows_faults_are_known_and_need_no_seconds() -> None:
    for kind in ("read-error", "rows-incomplete", "rows-malformed"):
        assert parse_fault(kind).kind == kind
