"""PostgreSQL locations: a libpq-style DSN plus runner's own ``schema`` parameter.

``postgresql://user@host:5432/dbname?schema=leads_eu`` names the store: the database on
the server and the PostgreSQL schema inside it that holds runner's tables (default
``runner``).  ``schema`` is runner's, not libpq's, so it is taken out of the DSN before
asyncpg sees it (asyncpg would send an unknown parameter to the server as a setting).
Every other parameter (``sslmode``, ``connect_timeout`` …) goes to asyncpg unchanged.

Messages name a location by :func:`describe`, which never shows a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from runner.errors import UsageError

DEFAULT_SCHEMA = "runner"
#: lower-case identifiers only: no quoting surprises, no case folding questions
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class PgLocation:
    dsn: str  # what asyncpg gets: the DSN without runner's parameters
    schema: str
    where: str  # host:port/dbname, for messages

    @property
    def schema_ident(self) -> str:
        """The schema as a quoted SQL identifier (the name is validated: no quotes)."""
        return f'"{self.schema}"'


def parse(location: str) -> PgLocation:
    try:
        parts = urlsplit(location)
        parts.port  # noqa: B018 - parsed lazily: a bad port or host raises here
    except ValueError as exc:  # the message names the part, never the password
        raise UsageError(f"bad PostgreSQL DSN: {exc}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise UsageError("a PostgreSQL store is a postgresql:// DSN")
    params = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for name, value in params if name == "schema"]
    rest = [(name, value) for name, value in params if name != "schema"]
    if len(schemas) > 1:
        raise UsageError("the DSN names more than one schema")
    schema = schemas[0] if schemas else DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise UsageError(
            f"schema {schema!r} is not a plain lower-case SQL name "
            "(letters, digits, underscores; at most 63)"
        )
    dsn = urlunsplit(parts._replace(query=urlencode(rest)))
    return PgLocation(dsn=dsn, schema=schema, where=describe(location))


def schema_of(location: str) -> str:
    """The schema a location names (default ``runner``), without validating it."""
    names = [v for k, v in parse_qsl(urlsplit(location).query) if k == "schema"]
    return names[0] if names else DEFAULT_SCHEMA


def describe(location: str) -> str:
    """``host:port/dbname`` (never user or password), for error messages."""
    try:
        parts = urlsplit(location)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "the PostgreSQL server"
    database = parts.path.lstrip("/") or "(default database)"
    return f"{host}:{port}/{database}"
