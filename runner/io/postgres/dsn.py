"""PostgreSQL locations: a libpq-style DSN plus runner's own ``schema`` parameter.

``postgresql://user@host:5432/dbname?schema=leads_eu`` names the store: the database on
the server and the PostgreSQL schema inside it that holds runner's tables (default
``runner``).  ``schema`` is runner's, not libpq's, so it is taken out of the DSN before
asyncpg sees it (asyncpg would send an unknown parameter to the server as a setting).
Every other parameter (``sslmode``, ``connect_timeout``, ``target_session_attrs`` …) goes
to asyncpg unchanged.

Several hosts, as libpq takes them (issue 30)::

    postgresql://user@h1:5432,h2:5433/dbname?target_session_attrs=read-write

runner tries the hosts in order and keeps the first that answers and matches
``target_session_attrs`` (``read-write``: the primary; ``any``, the default: the first
that answers), as libpq does.  It tries them one by one itself (``PgLocation.hosts``, one
DSN per host) rather than handing asyncpg the list: asyncpg's connect timeout covers the
whole list, so a first host that never answers (its machine gone, no TCP reset) would use
it up and the second would never be tried (MagicStack/asyncpg#1155).  ``connect_timeout``
(libpq's, in seconds) is each host's timeout; runner takes it out of the DSN, since
asyncpg would send it to the server as a setting.  A host without a port takes 5432; IPv6
addresses go in brackets.  Each port is checked here, so a bad one is one usage line,
not a driver's error.

Messages name a location by :func:`describe` (``h1:5432,h2:5433/dbname``), which never
shows the user or a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from runner.errors import UsageError

DEFAULT_SCHEMA = "runner"
DEFAULT_PORT = 5432
#: lower-case identifiers only: no quoting surprises, no case folding questions
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: one host of the list: ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``
_HOST = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>[^:]*))?")
#: what asyncpg takes for ``target_session_attrs`` (libpq's values)
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")


@dataclass(frozen=True)
class PgLocation:
    dsn: str  # what asyncpg gets: the DSN without runner's parameters
    schema: str
    where: str  # host:port[,host:port…]/dbname, for messages
    #: the ``target_session_attrs`` the DSN asks for (None: not given, asyncpg's ``any``)
    session_attrs: str | None = None
    #: the names of the DSN's parameters (runner's ``schema`` excluded)
    params: frozenset[str] = frozenset()
    #: one ``(host:port, DSN)`` per host, tried in order (one: the DSN as given)
    hosts: tuple[tuple[str, str], ...] = ()
    #: each host's connect timeout in seconds (the DSN's ``connect_timeout``; None: not
    #: given)
    connect_timeout: float | None = None

    @property
    def schema_ident(self) -> str:
        """The schema as a quoted SQL identifier (the name is validated: no quotes)."""
        return f'"{self.schema}"'

    @property
    def several_hosts(self) -> bool:
        return "," in self.where.split("/", 1)[0]


def hosts(location: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a DSN's host list, in order (a host left empty is
    ``localhost``, a port left out 5432); ValueError naming the bad part."""
    netloc = urlsplit(location).netloc.rpartition("@")[2]
    found = []
    for spec in netloc.split(","):
        match = _HOST.fullmatch(spec)
        if match is None:
            raise ValueError(f"host {spec!r} is not HOST[:PORT]")
        host, port = match["host"], match["port"]
        if port is None or port == "":
            number = DEFAULT_PORT
        elif port.isdigit() and 0 < int(port) < 65536:
            number = int(port)
        else:
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
        found.append((host or "localhost", number))
    return found


def parse(location: str) -> PgLocation:
    try:
        parts = urlsplit(location)
        hosts(location)
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
    timeouts = [value for name, value in rest if name == "connect_timeout"]
    rest = [(name, value) for name, value in rest if name != "connect_timeout"]
    timeout = None
    if timeouts:
        text = timeouts[-1].strip()
        if not text.isdigit():
            raise UsageError(f"bad PostgreSQL DSN: connect_timeout={timeouts[-1]!r} is not a "
                             "whole number of seconds")
        # libpq's rule: 0 is no timeout (runner keeps its own), less than 2 is 2
        timeout = max(2.0, float(text)) if int(text) else None
    attrs = [value for name, value in rest if name == "target_session_attrs"]
    if len(attrs) > 1:
        raise UsageError("the DSN gives target_session_attrs more than once")
    if attrs and attrs[0] not in SESSION_ATTRS:
        raise UsageError(f"bad PostgreSQL DSN: target_session_attrs={attrs[0]!r} is not "
                         f"one of {', '.join(SESSION_ATTRS)}")
    dsn = urlunsplit(parts._replace(query=urlencode(rest)))
    found = hosts(location)
    if len(found) == 1:
        each: tuple[tuple[str, str], ...] = ((_label(*found[0]), dsn),)
    else:
        user = parts.netloc.rpartition("@")[0]
        each = tuple(
            (_label(host, port), urlunsplit(parts._replace(
                netloc=f"{user}@{host}:{port}" if user else f"{host}:{port}",
                query=urlencode(rest))))
            for host, port in found)
    return PgLocation(dsn=dsn, schema=schema, where=describe(location),
                      session_attrs=attrs[0] if attrs else None,
                      params=frozenset(name for name, _ in rest), hosts=each,
                      connect_timeout=timeout)


def _label(host: str, port: int) -> str:
    return f"{host}:{port}"


def schema_of(location: str) -> str:
    """The schema a location names (default ``runner``), without validating it."""
    names = [v for k, v in parse_qsl(urlsplit(location).query) if k == "schema"]
    return names[0] if names else DEFAULT_SCHEMA


def describe(location: str) -> str:
    """``host:port[,host:port…]/dbname`` (never user or password), for messages."""
    try:
        parts = urlsplit(location)
        found = hosts(location)
    except ValueError:
        return "the PostgreSQL server"
    database = parts.path.lstrip("/") or "(default database)"
    return ",".join(_label(host, port) for host, port in found) + f"/{database}"
