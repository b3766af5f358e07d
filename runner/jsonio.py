"""Strict JSON in, canonical JSON out.

Input is parsed strictly: UTF-8 only, no duplicate keys (``{"a": 1, "a": 2}`` would make
"the same content" ambiguous), no ``NaN``/``Infinity``, a bounded size and depth.  Every
failure is a :class:`BadInputError` with a stable reason and a message that never echoes
the input (it may hold contact fields).

The canonical form (SPEC L3) is sorted keys, no insignificant whitespace, UTF-8: two
records are "the same" exactly when their canonical forms are byte-equal.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from runner.errors import BadInputError

#: the largest JSON document runner reads (a lead event is a few hundred bytes)
MAX_DOCUMENT_BYTES = 1 << 20
#: the deepest nesting accepted (events and snapshots are shallow objects)
MAX_DEPTH = 32


#: longer integer literals are refused (Python refuses to convert them anyway)
MAX_INT_DIGITS = 4000


def _reject_constant(name: str) -> Any:
    raise BadInputError(f"JSON constant {name} is not allowed", reason="invalid_json")


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON syntax but overflows to infinity, which no JSON can carry back
    value = float(text)
    if not math.isfinite(value):
        raise BadInputError("JSON number out of range", reason="invalid_json")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise BadInputError("JSON integer has too many digits", reason="invalid_json")
    return int(text)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise BadInputError("JSON object has a duplicate key", reason="invalid_json")
    return out


def _check_tree(value: Any, what: str) -> None:
    """Bound the depth and refuse lone surrogates (``"\\ud800"`` is valid JSON but not
    encodable UTF-8), iteratively so a deep document cannot blow the Python stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > MAX_DEPTH:
                raise BadInputError(f"{what} is nested too deeply", reason="invalid_json")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str):
                    _check_text(key, what)
                stack.append((child, level + 1))
        elif isinstance(item, str):
            _check_text(item, what)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _might_need_checking(text: str) -> bool:
    """Cheap pre-check: a document can hold a lone surrogate only through a ``\\uD800``-
    style escape (valid UTF-8 cannot encode one), and can be nested deeper than
    ``MAX_DEPTH`` only if it has that many brackets."""
    brackets = text.count("{") + text.count("[")
    return brackets > MAX_DEPTH or _SURROGATE_ESCAPE.search(text) is not None


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError(
            f"{what} has a string that is not valid Unicode", reason="invalid_json"
        ) from None


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                            parse_float=_finite_float, parse_int=_bounded_int)


def parse_json(data: bytes | str, *, what: str = "document") -> Any:
    """Parse one JSON document strictly."""
    if isinstance(data, str):
        data = data.encode("utf-8", errors="surrogatepass")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BadInputError(
            f"{what} is larger than {MAX_DOCUMENT_BYTES} bytes", reason="too_large"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError(f"{what} is not valid UTF-8", reason="invalid_json") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise BadInputError(f"{what} is nested too deeply", reason="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise BadInputError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            reason="invalid_json",
        ) from None
    if _might_need_checking(text):
        _check_tree(value, what)
    return value


def storable(value: Any) -> bool:
    """Whether both backends can store ``value``'s JSON as text: no string in it (key or
    value) holds the NUL character, which PostgreSQL's text and jsonb refuse, or a lone
    surrogate, which UTF-8 cannot encode."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, str) and not storable_text(item):
            return False
    return True


def storable_text(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_object(data: bytes | str, *, what: str = "document") -> dict[str, Any]:
    value = parse_json(data, what=what)
    if not isinstance(value, dict):
        raise BadInputError(f"{what} is not a JSON object", reason="not_an_object")
    return value


def read_json_object(path: str | Path, *, what: str) -> dict[str, Any]:
    """Read a JSON object from a file (``-`` is not special here)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise BadInputError(
            f"cannot read {what} {str(path)!r}: {exc.strerror or exc}", reason="unreadable"
        ) from None
    return parse_object(data, what=what)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
_LINE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value``: sorted keys, compact, non-ASCII kept."""
    return _CANONICAL.encode(value)


def dumps_line(value: Any) -> str:
    """One line of compact JSON for stdout (K8)."""
    return _LINE.encode(value)
