"""The PostgreSQL table target's pure rules, case by case (issue 29): failure
classification of a write and a read, the table name and DSN, the shape check and the
identity in the comment.  The same rules against a real server:
tests/test_pgtable_target.py."""

from __future__ import annotations

import asyncpg
import pytest

from runner.errors import UsageError
from runner.io.targets.pgtable.classify import classify_read, classify_write, severity
from runner.io.targets.pgtable.names import (
    check_table_option,
    describe_target,
    parse_location,
)
from runner.io.targets.pgtable.shape import (
    COLUMNS,
    Column,
    TableFacts,
    identity,
    problems,
    refusal,
    store_tables,
    with_identity,
)
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RejectedWrite,
    TargetReadError,
)

pytestmark = pytest.mark.timeout(30)

WHERE = "table public.leads at 127.0.0.1:5432/test"


def server(cls: type[asyncpg.PostgresError], severity_en: str | None,
           message: str = "boom") -> asyncpg.PostgresError:
    """An error as the server sends it: its class (by SQLSTATE) and severity."""
    exc = cls(message)
    exc.severity_en = severity_en  # type: ignore[attr-defined]
    exc.severity = severity_en  # type: ignore[attr-defined]
    return exc


E = asyncpg.exceptions
# the exception, the phase -> the error class the adapter raises
WRITE_CASES = [
    # before the statement: whatever failed, nothing was sent
    (ConnectionRefusedError(111, "Connection refused"), "connect", BeforeWriteError),
    (TimeoutError(), "connect", BeforeWriteError),
    (OSError(113, "No route to host"), "connect", BeforeWriteError),
    (server(E.InvalidPasswordError, "FATAL"), "connect", BeforeWriteError),
    (server(E.InvalidCatalogNameError, "FATAL"), "connect", BeforeWriteError),
    (server(E.CannotConnectNowError, "FATAL"), "connect", BeforeWriteError),
    (server(E.TooManyConnectionsError, "FATAL"), "connect", BeforeWriteError),
    (E.InterfaceError("connection is closed"), "connect", BeforeWriteError),
    (RuntimeError("anything"), "connect", BeforeWriteError),
    # the server refused the statement (ERROR): rolled back whole; the request's fault
    (server(E.UniqueViolationError, "ERROR"), "statement", RejectedWrite),
    (server(E.NotNullViolationError, "ERROR"), "statement", RejectedWrite),
    (server(E.CheckViolationError, "ERROR"), "statement", RejectedWrite),
    (server(E.StringDataRightTruncationError, "ERROR"), "statement", RejectedWrite),
    (server(E.InvalidTextRepresentationError, "ERROR"), "statement", RejectedWrite),
    (server(E.UndefinedTableError, "ERROR"), "statement", RejectedWrite),
    (server(E.UndefinedColumnError, "ERROR"), "statement", RejectedWrite),
    (server(E.InsufficientPrivilegeError, "ERROR"), "statement", RejectedWrite),
    (server(E.InvalidColumnReferenceError, "ERROR"), "statement", RejectedWrite),  # 42P10
    (server(E.FeatureNotSupportedError, "ERROR"), "statement", RejectedWrite),
    (server(E.RaiseError, "ERROR"), "statement", RejectedWrite),  # a trigger's RAISE
    # ... or not the request's fault, but still nothing applied
    (server(E.DiskFullError, "ERROR"), "statement", BeforeWriteError),
    (server(E.SerializationError, "ERROR"), "statement", BeforeWriteError),
    (server(E.DeadlockDetectedError, "ERROR"), "statement", BeforeWriteError),
    (server(E.LockNotAvailableError, "ERROR"), "statement", BeforeWriteError),
    (server(E.QueryCanceledError, "ERROR"), "statement", BeforeWriteError),
    (server(E.ReadOnlySQLTransactionError, "ERROR"), "statement", BeforeWriteError),
    # the session ended (FATAL, PANIC): maybe after the commit
    (server(E.AdminShutdownError, "FATAL"), "statement", AmbiguousWriteError),
    (server(E.CrashShutdownError, "FATAL"), "statement", AmbiguousWriteError),
    (server(E.UniqueViolationError, "FATAL"), "statement", AmbiguousWriteError),
    (server(E.InternalServerError, "PANIC"), "statement", AmbiguousWriteError),
    # no severity: the client's own (lost connection, timeout), or an unknown error
    (server(E.UniqueViolationError, None), "statement", AmbiguousWriteError),
    (E.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
     "statement", AmbiguousWriteError),
    (E.InterfaceError("connection is closed"), "statement", AmbiguousWriteError),
    (E.InternalClientError("protocol"), "statement", AmbiguousWriteError),
    # the driver refused to start the statement (an error on the idle session, a
    # shutdown's FATAL, still being consumed): nothing of it was written
    (E.InternalClientError("cannot switch to state 12; another operation (2) is in "
                           "progress"), "statement", BeforeWriteError),
    (E.InternalClientError("cannot switch to state 15; another operation (2) is in "
                           "progress"), "commit", BeforeWriteError),
    (ConnectionResetError(104, "Connection reset by peer"), "statement",
     AmbiguousWriteError),
    (BrokenPipeError(32, "Broken pipe"), "statement", AmbiguousWriteError),
    (TimeoutError(), "statement", AmbiguousWriteError),
    (RuntimeError("anything"), "statement", AmbiguousWriteError),
]


@pytest.mark.parametrize(("exc", "phase", "expected"), WRITE_CASES,
                         ids=[f"{type(c[0]).__name__}-{severity(c[0])}-{c[1]}"
                              for c in WRITE_CASES])
def test_a_write_failure_is_classified_by_its_phase_and_the_servers_severity(
        exc: BaseException, phase: str, expected: type[Exception]) -> None:
    found = classify_write(exc, phase, WHERE)  # type: ignore[arg-type]
    assert type(found) is expected
    assert WHERE in found.message
    assert "\n" not in found.message


@pytest.mark.parametrize(("exc", "phase", "kind"), [
    (ConnectionRefusedError(111, "Connection refused"), "connect", "refused"),
    (server(E.AdminShutdownError, "FATAL"), "connect", "refused"),
    (server(E.CheckViolationError, "ERROR"), "statement", "rejected"),
    (server(E.DiskFullError, "ERROR"), "statement", "not_sent"),
    (server(E.AdminShutdownError, "FATAL"), "statement", "server_error"),
    (server(E.InternalServerError, "PANIC"), "statement", "server_error"),
    (TimeoutError(), "statement", "timed_out"),
    (E.ConnectionDoesNotExistError("closed in the middle"), "statement", "dropped"),
    (ConnectionResetError(104, "reset"), "statement", "dropped"),
    (E.InterfaceError("connection is closed"), "statement", "dropped"),
    (E.InternalClientError("cannot switch to state 12; another operation (2) is in "
                           "progress"), "statement", "refused"),
    (RuntimeError("anything"), "statement", "ambiguous"),
])
def test_each_write_failure_says_what_happened_for_the_operator(
        exc: BaseException, phase: str, kind: str) -> None:
    assert classify_write(exc, phase, WHERE).failure == kind  # type: ignore[arg-type]


def test_a_rejected_write_carries_the_servers_reason_and_sqlstate() -> None:
    found = classify_write(server(E.CheckViolationError, "ERROR",
                                  'new row violates check constraint "no_tests"'),
                           "statement", WHERE)
    assert isinstance(found, RejectedWrite)
    assert "no_tests" in found.message and "SQLSTATE 23514" in found.message
    assert "nothing was applied" in found.message


def test_the_localized_severity_is_used_when_the_english_one_is_absent() -> None:
    exc = E.UniqueViolationError("x")
    exc.severity = "error"  # type: ignore[attr-defined]
    assert severity(exc) == "ERROR"
    assert isinstance(classify_write(exc, "statement", WHERE), RejectedWrite)


@pytest.mark.parametrize("exc", [c[0] for c in WRITE_CASES][:12])
def test_every_read_failure_is_a_target_read_error(exc: BaseException) -> None:
    found = classify_read(exc, WHERE, "a readback")
    assert type(found) is TargetReadError
    assert found.message.startswith(f"a readback from {WHERE} failed")


# -- names -------------------------------------------------------------------------------

DSN = "postgresql://root@127.0.0.1:5432/test"


@pytest.mark.parametrize(("target", "table", "schema", "name"), [
    (DSN, "leads", "public", "leads"),
    (DSN, "crm.leads", "crm", "leads"),
    (DSN + "?schema=crm", "leads", "crm", "leads"),
    (DSN + "?schema=crm", "crm.leads", "crm", "leads"),
    ("postgres://u@h/db", "_l9", "public", "_l9"),
    (DSN, "a" * 63, "public", "a" * 63),
])
def test_a_table_name_is_qualified_by_its_own_schema_else_the_dsns_else_public(
        target: str, table: str, schema: str, name: str) -> None:
    loc = parse_location(target, table)
    assert (loc.schema, loc.table) == (schema, name)
    assert loc.ident == f'"{schema}"."{name}"'
    assert "schema=" not in loc.dsn


@pytest.mark.parametrize(("table", "why"), [
    ("Leads", "lower-case"), ("leads;drop table x", "lower-case"), ('"leads"', "lower-case"),
    ("a.b.c", "lower-case"), ("1leads", "lower-case"), ("", "lower-case"),
    ("crm.", "lower-case"), ("a" * 64, "lower-case"), ("lead s", "lower-case"),
    ("pg_catalog.leads", "system schema"), ("information_schema.x", "system schema"),
])
def test_a_table_name_that_is_not_a_plain_name_is_a_usage_error(table: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_location(DSN, table)


def test_a_table_schema_and_a_dsn_schema_that_disagree_are_refused() -> None:
    with pytest.raises(UsageError, match="give one of them"):
        parse_location(DSN + "?schema=crm", "sales.leads")
    with pytest.raises(UsageError, match="system schema"):
        parse_location(DSN + "?schema=pg_toast", "leads")


@pytest.mark.parametrize(("target", "table", "adapter", "why"), [
    (DSN, None, None, "needs --target-table NAME"),
    ("postgres://u@h/db", None, None, "needs --target-table NAME"),
    ("queue-target.db", "leads", None, "is for a postgresql:// --target"),
    ("http://127.0.0.1:9/sheet", "leads", None, "is for a postgresql:// --target"),
    (None, "leads", None, "is for a postgresql:// --target"),
    (DSN, "leads", "my_mod:make", "not for a --target-adapter"),
    (DSN, "Leads", None, "lower-case"),
    ("postgresql://u@h:port/db", "leads", None, "bad PostgreSQL DSN"),
])
def test_the_target_table_option_and_a_postgresql_target_go_together(
        target: str | None, table: str | None, adapter: str | None, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        check_table_option(target, table, adapter)


def test_a_postgresql_target_with_its_table_or_an_adapter_passes_the_check() -> None:
    check_table_option(DSN, "leads", None)
    check_table_option(DSN, None, "my_mod:make")  # an adapter takes any --target
    check_table_option("sheet.db", None, None)


def test_a_dsn_target_is_described_without_its_user_or_password() -> None:
    secret = "postgresql://alice:s3cret@db.example:6432/crm"
    assert describe_target(secret, "leads") == "table public.leads at db.example:6432/crm"
    assert describe_target(secret) == "db.example:6432/crm"
    assert describe_target("sheet.db") == "sheet.db"
    assert "s3cret" not in repr(parse_location(secret, "leads").describe())


# -- the shape check and the identity ------------------------------------------------------


def good_columns(**changed: Column | None) -> tuple[Column, ...]:
    columns = {name: Column(name, kind, name in ("write_id", "status"), name == "status")
               for name, kind in COLUMNS}
    for name, column in changed.items():
        if column is None:
            columns.pop(name, None)
        else:
            columns[name] = column
    return tuple(columns.values())


def facts(**kw: object) -> TableFacts:
    base: dict[str, object] = {"has_schema": True, "exists": True, "kind": "r",
                               "keyed": True, "columns": good_columns()}
    base.update(kw)
    return TableFacts(**base)  # type: ignore[arg-type]


def test_the_documented_shape_passes_and_so_do_varchar_and_extra_columns() -> None:
    assert problems(facts(), "leads") == []
    varchar = Column("tenant", "character varying", True, False)
    extra = (Column("owner", "text", False, False), Column("at", "timestamptz", True, True))
    assert problems(facts(columns=good_columns(tenant=varchar) + extra), "leads") == []
    assert problems(facts(kind="p"), "leads") == []  # a partitioned table


@pytest.mark.parametrize(("changed", "words"), [
    ({"columns": good_columns(contact_alias=None)}, "no column contact_alias"),
    ({"columns": good_columns(is_test=Column("is_test", "text", True, False))},
     "column is_test is text, not boolean"),
    ({"columns": good_columns(tenant=Column("tenant", "character(20)", True, False))},
     "column tenant is character(20), not text"),
    ({"columns": good_columns(write_id=Column("write_id", "uuid", True, False))},
     "column write_id is uuid, not text"),
    ({"keyed": False}, "no unique key on write_id"),
    ({"columns": good_columns(contact_alias=Column("contact_alias", "text", True, False))},
     "contact_alias is NOT NULL"),
    ({"columns": good_columns(status=Column("status", "text", False, True))},
     "status must be NOT NULL with a default"),
    ({"columns": good_columns(status=Column("status", "text", True, False))},
     "status must be NOT NULL with a default"),
    ({"columns": (*good_columns(), Column("owner", "text", True, False))},
     "column owner is NOT NULL without a default"),
    ({"kind": "v"}, "it is a view, not a table"),
    ({"kind": "m"}, "it is a materialized view"),
    ({"kind": "f"}, "it is a foreign table"),
    ({"comment": "runner-target-id: " + "a" * 32 + "\nrunner-target-id: " + "b" * 32},
     "two runner identities"),
    ({"store_schema": True}, "one of runner's own store tables"),
])
def test_a_table_of_the_wrong_shape_is_refused_naming_what_is_wrong(
        changed: dict[str, object], words: str) -> None:
    found = refusal(facts(**changed), "leads", WHERE)
    assert found is not None
    assert words in found
    assert found.startswith(f"{WHERE} is not a target table: ")
    assert found.endswith("it was left untouched (see 'Deliver into a PostgreSQL table')")


def test_every_problem_of_a_table_is_named_in_one_line() -> None:
    found = refusal(facts(keyed=False, columns=good_columns(
        source=None, is_test=Column("is_test", "integer", True, False))), "t", WHERE)
    assert found is not None and "\n" not in found
    assert "no column source" in found and "is_test is integer" in found
    assert "no unique key on write_id" in found


def test_a_store_tables_name_is_refused_only_in_a_schema_that_holds_a_store() -> None:
    assert {"leads", "meta", "outbox", "target_pin", "schema_migrations"} <= store_tables()
    assert problems(facts(store_schema=False), "leads") == []
    assert problems(facts(store_schema=True), "crm_leads") == []
    assert problems(facts(store_schema=True), "outbox")


def test_the_identity_is_one_line_of_the_comment_and_a_users_comment_is_kept() -> None:
    assert identity(None) is None
    assert identity("our leads") is None
    made = with_identity(None, "c" * 32)
    assert identity(made) == "c" * 32
    adopted = with_identity("Our leads, from the web form.\n", "d" * 32)
    assert adopted.startswith("Our leads, from the web form.\nrunner-target-id: " + "d" * 32)
    assert identity(adopted) == "d" * 32
    assert identity("runner-target-id: " + "e" * 32 + "\nrunner-target-id: " + "e" * 32) \
        == "e" * 32
    assert identity("runner-target-id: " + "a" * 32 + "\nrunner-target-id: " + "b" * 32) \
        is None
    assert identity("xrunner-target-id: " + "a" * 32) is None
