"""Bulk intake's one-pass path for plain lines (``runner.leads.models.plain_event``) gives
exactly the exact path's answer (``parse_object``, then ``prepare``) for every line: the
fuzz suite's malformed events, and valid events written in many ways (key order,
whitespace, escapes, non-ASCII text, repeated keys, another scope).  Pure: no store."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from runner.clock import SystemClock
from runner.errors import BadInputError
from runner.jsonio import MAX_DOCUMENT_BYTES
from runner.leads.intake import Batch, Intake
from runner.leads.models import Scope, plain_event
from tests.fuzzgen import cases
from tests.helpers import CANARY, SCOPE

SCOPE_MODEL = Scope.model_validate(SCOPE)
INTAKE = Intake(None, SystemClock(), SCOPE_MODEL)  # type: ignore[arg-type]  # pure calls only


def _exact(lines: list[bytes]) -> Batch:
    from runner.jsonio import parse_object

    docs: list[Any] = []
    for line in lines:
        try:
            docs.append(parse_object(line, what="record"))
        except BadInputError as exc:
            docs.append(exc)
    return INTAKE.prepare_batch(docs)


def _seen(batch: Batch) -> tuple[list[Any], list[Any]]:
    """Everything of a batch but the fresh write_ids."""
    results = [None if r is None else (r.to_json(), r.message) for r in batch.results]
    valid = [(i, ev.model_dump(), ev.model_fields_set, item.canonical)
             for i, ev, item in batch.valid]
    return results, valid


def assert_same(lines: list[bytes]) -> None:
    assert _seen(INTAKE.prepare_lines(lines)) == _seen(_exact(lines))


def test_the_fuzz_events_get_the_exact_answers() -> None:
    lines = [c.raw for c in cases(10_000, 6) if c.kind == "event"]
    assert_same(lines)
    assert all(r is not None for r in INTAKE.prepare_lines(lines).results)  # all rejected


def _spaced(rng: random.Random, text: str) -> str:
    """``text`` (compact JSON) with random JSON whitespace between tokens."""
    out = []
    in_string = escaped = False
    for ch in text:
        out.append(ch)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{:,":
            out.append(rng.choice(["", "", " ", " ", "  ", " ", "\t", " \r "]))
    return "".join(out)


ALIASES = [CANARY, "", "plain text", "quote \" inside", "back\\slash", "tab\there",
           "nul\x00", "ünïcödé", "emoji \U0001F600", "line\u2028sep", "\u00a0nbsp",
           "x" * 1024, "x" * 1025, "{[\"nested-looking\"]}"]


def _valid_variant(rng: random.Random, i: int) -> bytes:
    doc: dict[str, Any] = {**SCOPE, "source": "meta", "source_lead_id": f"k-{i}",
                           "synthetic": True}
    if rng.random() < 0.8:
        doc["contact_alias"] = rng.choice(ALIASES)
    if rng.random() < 0.1:
        doc["source_lead_id"] = rng.choice(["ключ", "k\"q", "", "k" * 513, "k\\u0000"])
    if rng.random() < 0.1:
        doc[rng.choice(["tenant_id", "page_id"])] = rng.choice(["other", SCOPE["form_id"]])
    items = list(doc.items())
    rng.shuffle(items)
    text = json.dumps(dict(items), ensure_ascii=rng.random() < 0.3, separators=(",", ":"))
    if rng.random() < 0.15:  # a repeated key, with the same or another value
        key = rng.choice(list(doc))
        again = json.dumps({key: rng.choice([doc[key], "other", True])})[1:-1]
        text = text[:-1] + "," + again + "}"
    if rng.random() < 0.5:
        text = _spaced(rng, text)
    if rng.random() < 0.05:
        text = rng.choice(["\ufeff", " ", "\u00a0", "\u3000"]) + text
    return text.encode("utf-8", errors="surrogatepass")


def test_valid_and_nearly_valid_events_get_the_exact_answers() -> None:
    rng = random.Random(21)
    lines = [_valid_variant(rng, i) for i in range(4000)]
    assert_same(lines)
    plain = sum(plain_event(line, SCOPE_MODEL, MAX_DOCUMENT_BYTES) is not None
                for line in lines)
    assert 500 < plain < len(INTAKE.prepare_lines(lines).valid) < 4000  # both paths taken


@pytest.mark.parametrize("line", [
    b'{"tenant_id":"t","account_id":"a","page_id":"p","form_id":"f","source":"meta",'
    b'"source_lead_id":"k","synthetic":true,"synthetic":true}',
    b'{"tenant_id":"t","tenant_id":"t","account_id":"a","page_id":"p","form_id":"f",'
    b'"source":"meta","source_lead_id":"k","synthetic":true}',
])
def test_a_repeated_key_never_takes_the_one_pass_path(line: bytes) -> None:
    scope = Scope(tenant_id="t", account_id="a", page_id="p", form_id="f")
    assert plain_event(line, scope, MAX_DOCUMENT_BYTES) is None
    assert plain_event(line.replace(b',"synthetic":true}', b"}", 1) if line.count(
        b"synthetic") == 2 else line.replace(b'"tenant_id":"t",', b"", 1),
        scope, MAX_DOCUMENT_BYTES) is not None


def test_a_plain_line_takes_the_one_pass_path() -> None:
    line = json.dumps({**SCOPE, "source": "meta", "source_lead_id": "k", "synthetic": True,
                       "contact_alias": "ünïcödé"}, ensure_ascii=False).encode()
    event = plain_event(line, SCOPE_MODEL, MAX_DOCUMENT_BYTES)
    assert event is not None and event.contact_alias == "ünïcödé"
    assert plain_event(line, SCOPE_MODEL, len(line) - 1) is None  # over the limit
