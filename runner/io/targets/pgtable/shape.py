"""The target table's shape and identity, judged in pure code from catalog facts.

The columns runner creates (``queries.sql``, ``create_table``)::

    write_id       text PRIMARY KEY            the record's write_id: the dedupe key
    tenant         text NOT NULL               \\
    source         text NOT NULL                | the five record fields (SPEC L9)
    source_lead_id text NOT NULL                |
    is_test        boolean NOT NULL             |
    contact_alias  text                        /  NULL when the lead has none
    status         text NOT NULL DEFAULT 'new'  the business column polls report
    created_at     timestamptz NOT NULL DEFAULT now()   when the row arrived

Beside it, the batch mark (issue 30) is kept in a side table of the same schema,
``<table>_runner_mark`` (a table name too long for the suffix is cut short with a hash:
``names.side_name``), one row::

    one        boolean PRIMARY KEY DEFAULT true CHECK (one)   there is one row
    owner      text                        the store that owns the target (NULL: none yet)
    seq        bigint NOT NULL DEFAULT 0   the newest seq applied from it (epoch << 32 |
                                           counter)
    updated_at timestamptz NOT NULL DEFAULT now()            when it last changed

made with a table runner creates, or on the first marked write to a table made before
marks (or made by a user).  A side table of that name without ``one``, ``owner`` and
``seq`` of those types is refused as a wrong-shaped table is (:func:`mark_problems`).

A table made by someone else is taken when it has the same seven columns with these
types (``character varying`` counts as text), ``contact_alias`` nullable, ``status``
NOT NULL with a default, a unique, immediate, non-partial key on ``write_id`` alone (what
``ON CONFLICT (write_id)`` needs), and every other column nullable or with a default (an
insert names only runner's six columns).  Anything else is refused with every problem in
one line, before anything is sent, and the table is left untouched.  A table in a
schema that holds a runner store and named as one of the store's own tables is refused
whatever its columns.  Extra columns are allowed: a user's business columns, and room
for what issue 30 adds (a store identity and a batch sequence).

The identity is a line of the table's comment, ``runner-target-id: <32 hex digits>``,
written when runner creates the table, or adopts a table of the right shape that has none
(a user's own comment is kept above it).  It goes with the table: a table dropped and made
again has none (and a store pinned to the old one refuses it), a dump and restore keeps
it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

#: the columns runner writes and reads, with the type each must have
COLUMNS: tuple[tuple[str, str], ...] = (
    ("write_id", "text"), ("tenant", "text"), ("source", "text"),
    ("source_lead_id", "text"), ("is_test", "boolean"), ("contact_alias", "text"),
    ("status", "text"),
)
#: what counts as each required type (as ``regtype`` spells it)
SAME_TYPE = {"text": ("text", "character varying"), "boolean": ("boolean",)}
#: the table kinds that take rows: an ordinary and a partitioned table
TABLE_KINDS = ("r", "p")
_KIND_WORDS = {"v": "a view", "m": "a materialized view", "f": "a foreign table",
               "S": "a sequence", "i": "an index", "I": "an index", "c": "a type"}
IDENTITY_PREFIX = "runner-target-id: "
_IDENTITY = re.compile(r"^runner-target-id: ([0-9a-f]{32})$", re.MULTILINE)
IDENTITY_NOTE = ("(runner's identity of this table: keep this line, runner refuses a "
                 "table whose identity changed)")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as regtype spells it: text, boolean, character varying, …
    not_null: bool
    has_default: bool  # a DEFAULT, an identity or a generated column


@dataclass(frozen=True)
class TableFacts:
    """What the catalog says of the target table (``queries.sql``: inspect_table,
    table_columns)."""

    has_schema: bool
    exists: bool
    kind: str | None = None
    comment: str | None = None
    store_schema: bool = False  # the schema holds a runner store
    keyed: bool = False  # a key ON CONFLICT (write_id) can use
    columns: tuple[Column, ...] = ()
    #: the mark table's columns (name, type; empty: there is none)
    mark_columns: tuple[tuple[str, str], ...] = ()


@cache
def store_tables() -> frozenset[str]:
    """The names of a runner store's own tables (from its migrations' DDL)."""
    from runner.io.postgres import schema

    text = schema.BOOTSTRAP + "".join(schema.MIGRATIONS.values())
    return frozenset(re.findall(r"CREATE TABLE\s+\{s\}\.(\w+)", text))


def problems(facts: TableFacts, table: str) -> list[str]:
    """Everything that keeps an existing table from being a target, in words (empty: it
    is one)."""
    if facts.store_schema and table in store_tables():
        return ["it is one of runner's own store tables (this schema holds a runner "
                "store); name another table"]
    if facts.kind not in TABLE_KINDS:
        return [f"it is {_KIND_WORDS.get(facts.kind or '', 'not a table')}, not a table"]
    found = {c.name: c for c in facts.columns}
    out: list[str] = []
    missing = [name for name, _ in COLUMNS if name not in found]
    if missing:
        out.append("no column " + ", ".join(missing))
    for name, wanted in COLUMNS:
        column = found.get(name)
        if column is not None and column.type not in SAME_TYPE[wanted]:
            out.append(f"column {name} is {column.type}, not {wanted}")
    alias = found.get("contact_alias")
    if alias is not None and alias.not_null:
        out.append("column contact_alias is NOT NULL (a lead may have no alias)")
    status = found.get("status")
    if status is not None and not (status.not_null and status.has_default):
        out.append("column status must be NOT NULL with a default (DEFAULT 'new')")
    if "write_id" in found and not facts.keyed:
        out.append("no unique key on write_id alone (PRIMARY KEY or UNIQUE, not partial, "
                   "not deferrable)")
    required = {name for name, _ in COLUMNS}
    strict = [c.name for c in facts.columns
              if c.name not in required and c.not_null and not c.has_default]
    if strict:
        out.append("column " + ", ".join(strict) + " is NOT NULL without a default "
                   "(runner's insert does not fill it)")
    ids = set(_IDENTITY.findall(facts.comment or ""))
    if len(ids) > 1:
        out.append("its comment holds two runner identities")
    return out


#: the mark table's columns runner reads and writes, with the types each must have
MARK_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("one", ("boolean",)), ("owner", SAME_TYPE["text"]), ("seq", ("bigint",)),
)


def mark_problems(columns: Sequence[tuple[str, str]], mark_table: str) -> list[str]:
    """What keeps an existing mark table (its columns: name, type) from being one, in words
    (empty: it is one, or it is not there)."""
    if not columns:
        return []
    found = dict(columns)
    out = []
    for name, types in MARK_COLUMNS:
        if name not in found:
            out.append(f"its mark table {mark_table} has no column {name}")
        elif found[name] not in types:
            out.append(f"column {name} of its mark table {mark_table} is {found[name]}, "
                       f"not {types[0]}")
    return out


def refusal(facts: TableFacts, table: str, where: str,
            mark: Sequence[str] = ()) -> str | None:
    """The one line that refuses a table (None: it is a target); ``mark``: the problems of
    its mark table (:func:`mark_problems`)."""
    found = problems(facts, table) + list(mark)
    if not found:
        return None
    return (f"{where} is not a target table: " + "; ".join(found)
            + "; it was left untouched (see 'Deliver into a PostgreSQL table')")


def identity(comment: str | None) -> str | None:
    """The identity in a table's comment (None: it has none)."""
    ids = set(_IDENTITY.findall(comment or ""))
    return ids.pop() if len(ids) == 1 else None


def new_identity() -> str:
    return uuid.uuid4().hex


def with_identity(comment: str | None, target_id: str) -> str:
    """The comment that adds ``target_id`` to a table's comment, keeping what was there."""
    line = f"{IDENTITY_PREFIX}{target_id}\n{IDENTITY_NOTE}"
    return f"{comment.rstrip()}\n{line}" if comment and comment.strip() else line


def column_facts(rows: Sequence[Sequence[object]]) -> tuple[Column, ...]:
    """Columns from ``table_columns`` rows (name, type, not_null, has_default)."""
    return tuple(Column(str(r[0]), str(r[1]), bool(r[2]), bool(r[3])) for r in rows)
