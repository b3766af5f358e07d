"""A seeded generator of malformed events, scopes and snapshots (issue 8.6).

Every case starts from a valid document and gets one to three defects, each of which on
its own makes the document invalid: a wrong type, a missing or extra field, an empty or
oversized string, a scope value that differs by a space, a case or an invisible character,
then at the text level invalid UTF-8, deep nesting, NaN/Infinity, out-of-range numbers,
nulls, duplicate keys, a lone surrogate, a BOM, truncation, trailing garbage, or a
document that is not an object at all.  Events carry a canary ``contact_alias`` so a test
can check that no rejection ever echoes it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.helpers import CANARY, SCOPE

Doc = dict[str, Any]
KINDS = ("event", "scope", "snapshot")
ID_FIELDS = ("tenant_id", "account_id", "page_id", "form_id", "source_lead_id")
WRONG = [0, 1, -1, 1.5, True, False, None, [], {}, ["x"], {"a": "b"}]
MARK = "@@FUZZ@@"  # a string value replaced at the text level by raw bytes
RAW_VALUES = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999", b"9" * 5000,
              b"[" * 40 + b"]" * 40, b'{"a":' * 40 + b"1" + b"}" * 40, b"null",
              b'"\xff\xfe"', b'"\xe2\x82"', b'"\xc0\xaf"', b'"\\ud800"', b'"\\udfff x"',
              b'"' + b"\xed\xa0\x80" + b'"', b"tru", b"'single'", b"undefined"]
SNAPSHOT_RAW = [v for v in RAW_VALUES if v not in (b"null", b"[" * 40 + b"]" * 40)
                ] + [b"[" * 40 + b"]" * 40]
VARIANTS = [" {}", "{} ", "{}\u200b", "{}\u00a0", "\u2010{}", "{}\n", "{}\t"]


@dataclass(frozen=True)
class Case:
    kind: str
    raw: bytes
    what: str


def base_event(rng: random.Random) -> Doc:
    return {**SCOPE, "source": "meta", "source_lead_id": f"fuzz-{rng.randrange(10**6)}",
            "synthetic": True, "contact_alias": CANARY}


# -- document-level defects (each one invalid on its own) ---------------------------------

def _event_defects(rng: random.Random, doc: Doc, used: set[str]) -> str:
    field = rng.choice([f for f in (*ID_FIELDS, "source", "synthetic", "contact_alias")
                        if f not in used])
    used.add(field)
    choice = rng.randrange(6)
    if field == "contact_alias":
        doc[field] = rng.choice([v for v in WRONG if not isinstance(v, str)] + ["x" * 1025])
        return f"{field}: wrong type or too long"
    if choice == 0 and field not in ("contact_alias",):
        del doc[field]
        return f"{field}: missing"
    if choice == 1:
        doc[f"extra_{rng.randrange(100)}"] = rng.choice([*WRONG, "x", CANARY])
        return "an extra field"
    if field == "synthetic":
        doc[field] = rng.choice([v for v in WRONG if v is not True] + ["true", 1, "yes"])
        return "synthetic is not true"
    if field == "source":
        doc[field] = rng.choice(["Meta", "meta ", "", "facebook", 1, None, ["meta"]])
        return "source is not meta"
    if choice == 2:
        doc[field] = rng.choice(["", "x" * 513, "y" * 100_000])
        return f"{field}: empty or too long"
    if choice == 3 and field in SCOPE:
        doc[field] = rng.choice(VARIANTS).format(SCOPE[field]) if rng.random() < 0.7 \
            else SCOPE[field].upper()
        return f"{field}: differs from the scope"
    doc[field] = rng.choice([v for v in WRONG if not isinstance(v, str)])
    return f"{field}: wrong type"


def _scope_defects(rng: random.Random, doc: Doc, used: set[str]) -> str:
    field = rng.choice([f for f in SCOPE if f not in used])
    used.add(field)
    choice = rng.randrange(4)
    if choice == 0:
        del doc[field]
        return f"{field}: missing"
    if choice == 1:
        doc[rng.choice(["extra", "tenant", "TENANT_ID", "source"])] = "x"
        return "an extra field"
    if choice == 2:
        doc[field] = rng.choice(["", "x" * 513])
        return f"{field}: empty or too long"
    doc[field] = rng.choice([v for v in WRONG if not isinstance(v, str)])
    return f"{field}: wrong type"


def _snapshot_defects(rng: random.Random, doc: Doc, used: set[str]) -> str:
    if "missing" in used:
        doc[f"extra_{rng.randrange(100)}"] = "x"
        return "missing with another field"
    used.add("missing")
    doc["missing"] = rng.choice([False, None, 1, "true", [], {}, 0, "yes"])
    return "missing is not exactly true"


# -- text-level defects -------------------------------------------------------------------

def _text_defect(rng: random.Random, kind: str, text: bytes) -> tuple[bytes, str]:
    choice = rng.randrange(8)
    if choice == 0:
        return text[: rng.randrange(len(text))], "truncated"
    if choice == 1:
        return text + rng.choice([b"x", b"}", b",", b"\x00", b"{}", b" 1"]), "trailing garbage"
    if choice == 2:
        return b"\xef\xbb\xbf" + text, "a byte order mark"
    if choice == 3:
        return text.replace(b"{", b'{"dup": 1, "dup": 2, ', 1), "a duplicate key"
    if choice == 4:
        return rng.choice([b"null", b"[]", b"[{}]", b'"text"', b"1", b"true", b"",
                           b"   ", b"\x00", b"\xff"]), "not an object"
    if choice == 5:
        return b"[" * 33 + text + b"]" * 33, "nested too deeply"
    if choice == 6:
        return text[:-1] + b', "pad": "' + b"p" * (1 << 20) + b'"}', "larger than 1 MiB"
    return text.replace(b"{", b"{" + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]), 1), \
        "invalid UTF-8"


DEFECTS: dict[str, Callable[[random.Random, Doc, set[str]], str]] = {
    "event": _event_defects, "scope": _scope_defects, "snapshot": _snapshot_defects}


def one_case(rng: random.Random, kind: str) -> Case:
    doc: Doc = (base_event(rng) if kind == "event" else dict(SCOPE) if kind == "scope"
                else {"status": rng.choice(["new", "won"])})
    used: set[str] = set()
    what: list[str] = []
    mode = rng.randrange(4)  # 0: document defects, 1: a raw value, 2: text, 3: mixed
    if mode in (0, 3) or (mode == 1 and kind == "scope" and rng.random() < 0.5):
        for _ in range(rng.randint(1, 3 if kind != "snapshot" else 2)):
            what.append(DEFECTS[kind](rng, doc, used))
    if mode == 1:
        field = rng.choice(sorted(doc)) if doc and rng.random() < 0.7 else "raw"
        doc[field] = MARK
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
    if MARK.encode() in text:
        raw = rng.choice(SNAPSHOT_RAW if kind == "snapshot" else RAW_VALUES)
        text = text.replace(json.dumps(MARK).encode(), raw)
        what.append(f"a raw value {raw[:12]!r}")
    if mode in (2, 3) or not what:
        text, defect = _text_defect(rng, kind, text)
        what.append(defect)
    return Case(kind, text, "; ".join(what))


def cases(n: int, seed: int) -> Iterator[Case]:
    rng = random.Random(seed)
    for i in range(n):
        yield one_case(rng, KINDS[i % len(KINDS)])
