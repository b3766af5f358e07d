"""Named SQL, one ``queries.sql`` per dialect.

A file is a list of blocks, each opened by a ``-- name: NAME`` line; parameters are
written ``:param``.  SQLite binds ``:param`` itself; for PostgreSQL each name becomes a
``$n`` (the same name the same number) and the values are passed in that order.  Names
that start with ``_`` are a dialect's own (its hooks use them); every other name must be
defined by both dialects with the same parameters (``tests/test_queries.py``).
"""

from __future__ import annotations

import importlib
import re
from functools import cache, cached_property
from pathlib import Path

#: a name line; it must start its line (``parse`` checks).  No ``^`` here: a pattern that
#: opens with a literal lets the scan skip to each ``--`` instead of trying every position
_NAME = re.compile(r"--[ \t]*name:[ \t]*(\w+)[ \t]*$", re.MULTILINE)
# a quoted string, a quoted identifier or a comment is skipped whole; ``::type`` is a cast
_PARAM = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)")


class Query:
    """One named statement (a plain class: ``status`` imports this module, and a
    dataclass costs more to build than the whole file costs to read)."""

    def __init__(self, name: str, sql: str) -> None:
        self.name, self.sql = name, sql

    def __repr__(self) -> str:
        return f"Query({self.name!r})"

    @cached_property
    def params(self) -> tuple[str, ...]:
        """The parameter names, in the order of first use (found on first use: SQLite
        binds by name and never needs them)."""
        return tuple(dict.fromkeys(m.group(1) for m in _PARAM.finditer(self.sql)
                                   if m.group(1)))

    def numbered(self) -> str:
        """The SQL with ``$n`` placeholders (``n`` is the name's place in ``params``)."""
        place = {name: i for i, name in enumerate(self.params, 1)}

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            return match.group(0) if name is None else f"${place[name]}"

        return _PARAM.sub(sub, self.sql)


class QueryFileError(ValueError):
    pass


def parse(text: str) -> dict[str, Query]:
    """Every named block of ``text``; text before the first name is a comment."""
    marks = [m for m in _NAME.finditer(text) if m.start() == 0 or text[m.start() - 1] == "\n"]
    queries: dict[str, Query] = {}
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        name = mark.group(1)
        sql = text[mark.end(): after.start() if after else len(text)].strip()
        if "--" in sql:  # drop its comment lines (most statements have none)
            sql = "\n".join(line for line in sql.splitlines()
                            if not line.lstrip().startswith("--")).strip()
        if not sql:
            raise QueryFileError(f"query {name!r} is empty")
        if name in queries:
            raise QueryFileError(f"query {name!r} is defined twice")
        queries[name] = Query(name, sql)
    return queries


@cache
def load(package: str) -> dict[str, Query]:
    """The named queries of ``package``'s ``queries.sql`` (read once; beside the
    package's ``__init__``, a plain file: ``importlib.resources`` would cost ``status``
    more to import than the file costs to read)."""
    init = importlib.import_module(package).__file__
    assert init is not None
    return parse((Path(init).parent / "queries.sql").read_text(encoding="utf-8"))
