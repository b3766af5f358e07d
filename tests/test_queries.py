"""Named SQL (runner.io.engine.queries): the file format, and the two dialects' files
agreeing on every shared name and its parameters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.io.engine.queries import QueryFileError, load, parse

DIALECTS = ("runner.io.sqlite", "runner.io.postgres")
RUNNER = Path(__file__).resolve().parent.parent / "runner"
# a named statement run by the engine or a dialect: fetch("name", ...) and the like
_CALL = re.compile(r"\b(?:(?:fetch|fetch_values|execute|execute_many)\(|QUERIES\[)"
                   r"\s*\"([a-z_][a-z0-9_]*)\"")


def _shared(package: str) -> dict[str, frozenset[str]]:
    return {name: frozenset(q.params) for name, q in load(package).items()
            if not name.startswith("_")}


def test_parse_reads_names_parameters_and_skips_comments_strings_and_casts() -> None:
    queries = parse("""
-- a file comment
-- name: one
-- what it does
SELECT :a, ':not', "col:x", x::text, :b -- :nor_this
FROM t WHERE y = :a
-- name: two
UPDATE t SET z = :z
""")
    assert list(queries) == ["one", "two"]
    assert queries["one"].params == ("a", "b")
    assert "what it does" not in queries["one"].sql
    assert queries["one"].numbered().splitlines()[0] == (
        "SELECT $1, ':not', \"col:x\", x::text, $2 -- :nor_this")
    assert queries["one"].numbered().endswith("y = $1")
    assert queries["two"].params == ("z",)


@pytest.mark.parametrize(("text", "why"), [
    ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2", "defined twice"),
    ("-- name: a\n-- only a comment\n", "empty"),
])
def test_parse_refuses_a_duplicate_or_empty_query(text: str, why: str) -> None:
    with pytest.raises(QueryFileError, match=why):
        parse(text)


def test_both_dialects_define_the_same_names_with_the_same_parameters() -> None:
    sqlite, postgres = (_shared(p) for p in DIALECTS)
    assert sorted(set(sqlite) ^ set(postgres)) == []
    differ = {n: (sorted(sqlite[n]), sorted(postgres[n]))
              for n in sqlite if sqlite[n] != postgres[n]}
    assert differ == {}


def test_every_statement_the_code_runs_is_defined_and_every_definition_is_run() -> None:
    called = {m.group(1) for path in RUNNER.rglob("*.py")
              for m in _CALL.finditer(path.read_text(encoding="utf-8"))}
    defined = {name for p in DIALECTS for name in load(p)}
    assert sorted(called - defined) == []
    assert sorted(defined - called) == []
