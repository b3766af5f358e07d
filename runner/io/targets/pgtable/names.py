"""Where the PostgreSQL table target delivers: a ``postgresql://`` DSN and a table name,
checked before anything connects (no driver needed).

``--target-table NAME`` is ``table`` or ``schema.table``, each a plain lower-case SQL name
(the rule of the store's ``?schema=``: letters, digits and underscores, at most 63, no
quoting surprises and no case folding questions).  The table's schema is the one NAME
gives, else the DSN's ``?schema=`` parameter, else ``public``; a NAME and a ``?schema=``
that disagree are refused.  In SQL the name is always written quoted and qualified
(:attr:`TableLocation.ident`), never interpolated as given.

Messages name the target by :meth:`TableLocation.describe`, which never shows the user or
the password of the DSN.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from runner.errors import UsageError
from runner.io.postgres import dsn as pgdsn

#: the schema of an unqualified table name when the DSN names none
DEFAULT_SCHEMA = "public"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: schemas that are the server's own, never a target's
_SYSTEM = re.compile(r"pg_.*|information_schema")
NAME_RULE = ("a plain lower-case SQL name (letters a-z, digits, underscores; at most 63), "
             "optionally schema-qualified: leads or crm.leads")


def is_postgres_target(target: str | None) -> bool:
    """Whether a ``--target`` names a PostgreSQL database (the table target)."""
    return target is not None and target.startswith(("postgresql://", "postgres://"))


@dataclass(frozen=True)
class TableLocation:
    """A checked target table: where it is and how SQL names it."""

    dsn: str  # what asyncpg gets: the DSN without runner's ``schema`` parameter
    schema: str
    table: str
    where: str  # host:port/dbname, for messages
    #: the DSN as the store's connection reads it (its parameters, its connect_timeout)
    pg: pgdsn.PgLocation

    @property
    def ident(self) -> str:
        """The table as a quoted, qualified SQL identifier (both names are validated:
        no quote can be in them)."""
        return f'"{self.schema}"."{self.table}"'

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def mark_table(self) -> str:
        """The side table that keeps the batch mark (issue 30): ``<table>_runner_mark``
        in the table's schema (see :func:`side_name`)."""
        return side_name(self.table, MARK_SUFFIX)

    @property
    def mark_ident(self) -> str:
        """The mark table as a quoted, qualified SQL identifier."""
        return f'"{self.schema}"."{self.mark_table}"'

    @property
    def key_index(self) -> str:
        """The name of the index on (tenant, source_lead_id) runner makes with a table it
        creates (``read_by_keys``)."""
        return side_name(self.table, KEY_INDEX_SUFFIX)

    def describe(self) -> str:
        """``table crm.leads at host:5432/db`` (never the user or the password)."""
        return f"table {self.name} at {self.where}"


#: what the names of a table's side objects end with
MARK_SUFFIX = "_runner_mark"
KEY_INDEX_SUFFIX = "_runner_by_key"
#: PostgreSQL's longest name (longer ones are truncated, silently)
MAX_NAME = 63


def side_name(table: str, suffix: str) -> str:
    """``table + suffix``, or, when that is longer than a name may be, the table's name cut
    short with 8 hex digits of its hash (so two long table names never share one)."""
    if len(table) + len(suffix) <= MAX_NAME:
        return table + suffix
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    return f"{table[: MAX_NAME - len(suffix) - 9]}_{digest}{suffix}"


def parse_table_name(value: str) -> tuple[str | None, str]:
    """``table`` or ``schema.table`` -> (schema or None, table); UsageError otherwise."""
    parts = value.split(".")
    if len(parts) > 2 or not all(_NAME.fullmatch(part) for part in parts):
        raise UsageError(f"--target-table {value!r} is not {NAME_RULE}")
    if len(parts) == 2:
        if _SYSTEM.fullmatch(parts[0]):
            raise UsageError(f"--target-table {value!r}: {parts[0]!r} is a system schema "
                             "of the server, not one for a target table")
        return parts[0], parts[1]
    return None, parts[0]


def parse_location(target: str, table: str) -> TableLocation:
    """The target table a ``--target`` DSN and a ``--target-table`` name."""
    schema, name = parse_table_name(table)
    try:
        query = urlsplit(target).query
    except ValueError as exc:  # the message names the part, never the password
        raise UsageError(f"bad PostgreSQL DSN for --target: {exc}") from None
    given = [value for key, value in parse_qsl(query, keep_blank_values=True)
             if key == "schema"]
    loc = pgdsn.parse(target)  # checks the DSN and its ?schema=, and takes it out
    if given and schema is not None and given[0] != schema:
        raise UsageError(f"--target-table {table!r} names schema {schema!r}, the --target "
                         f"DSN's ?schema= names {given[0]!r}: give one of them")
    chosen = schema or (loc.schema if given else DEFAULT_SCHEMA)
    if _SYSTEM.fullmatch(chosen):
        raise UsageError(f"schema {chosen!r} is a system schema of the server, not one for "
                         "a target table")
    return TableLocation(dsn=loc.dsn, schema=chosen, table=name, where=loc.where, pg=loc)


def check_table_option(target: str | None, table: str | None, adapter: str | None) -> None:
    """``--target-table`` goes with a ``postgresql://`` ``--target`` (the built-in table
    target), and such a target needs one; both are checked here (UsageError, exit 2)."""
    if table is not None:
        if adapter is not None:
            raise UsageError("--target-table is for the built-in PostgreSQL table target, "
                             "not for a --target-adapter (which takes --target alone)")
        if not is_postgres_target(target):
            raise UsageError("--target-table is for a postgresql:// --target (the "
                             "PostgreSQL table target); without one, leave it out")
        assert target is not None
        parse_location(target, table)
    elif adapter is None and is_postgres_target(target):
        raise UsageError("a postgresql:// --target needs --target-table NAME: the table to "
                         "deliver into, created on first use (for example --target-table "
                         "leads)")


def describe_target(target: str | None, table: str | None = None) -> str | None:
    """A ``--target`` for logs and messages: a DSN as ``table NAME at host:port/db`` (a
    DSN may carry a password, never shown), anything else as given."""
    if target is None or not is_postgres_target(target):
        return target
    if table is not None:
        try:
            return parse_location(target, table).describe()
        except UsageError:
            pass
    return pgdsn.describe(target)
