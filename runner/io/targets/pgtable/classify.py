"""A failure of the PostgreSQL table target as runner's verdict: one pure function per
call kind, no I/O, so a table test walks every case (``tests/test_pgtable_classify.py``).

A write is two phases (a marked write, issue 30, three: below), and the adapter says which
one failed:

* ``connect``: getting a live session (connecting, or the ping of a session left idle)
  before the batch's statement is sent.  Whatever fails here, the statement never left:
  ``BeforeWriteError`` (the records are sent again).
* ``statement``: the ``INSERT`` was handed to the driver.  Then:

  - the server answered with an error of severity ``ERROR``: the statement failed, and
    as it runs in an implicit transaction of its own, it was rolled back whole: nothing
    was applied.  A fault of the request against this table (SQLSTATE class 22 data,
    23 constraint, 42 syntax or access, 0A not supported, P0 a trigger's ``RAISE``) is
    ``RejectedWrite`` with the server's reason (failed-safe, retried on the backoff
    schedule: a person may fix the table meanwhile); any other (class 53 resources,
    40 rollback, 55 lock, 57014 cancelled by ``statement_timeout``) is
    ``BeforeWriteError``;
  - the driver refused to start the statement on a session it had seen fail (asyncpg's
    ``InternalClientError`` "cannot switch to state …": an error the server sent on the
    idle session, a shutdown's ``FATAL``, is still being consumed; the state switch comes
    before any message of the statement is written): ``BeforeWriteError``;
  - anything else is ``AmbiguousWriteError``: a ``FATAL`` or ``PANIC`` ends the
    session and may come after the commit (a fast shutdown terminates a backend between
    its commit and its answer); a lost connection, a client timeout or an unknown error
    says nothing about whether the server committed.

A marked batch (``write_batch(items, mark=…)``) runs in an explicit transaction: the mark's
row lock, the check, the ``INSERT`` and the new mark, then ``COMMIT``.  Its phases:

* ``connect``: as above;
* ``uncommitted``: a statement of the open transaction failed, before ``COMMIT`` was sent.
  Whatever the failure (an ``ERROR``, a ``FATAL``, a lost connection, a timeout), nothing
  was applied: a transaction the server never received a ``COMMIT`` for is never
  committed (the session's end rolls it back).  ``RejectedWrite`` for the request's fault
  (the classes above), else ``BeforeWriteError``;
* ``commit``: ``COMMIT`` was handed to the driver: as ``statement`` (an ``ERROR`` there
  rolled the transaction back; anything else may have committed).

A read that fails in any way is ``TargetReadError``: it never means "no rows".
"""

from __future__ import annotations

from typing import Literal

import asyncpg

from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    RejectedWrite,
    TargetError,
    TargetReadError,
)

Phase = Literal["connect", "statement", "uncommitted", "commit"]
#: SQLSTATE classes of an ``ERROR`` that is the request's fault against this table
REJECTED_CLASSES = ("22", "23", "42", "0A", "P0")
#: the longest server message kept in an error
MAX_REASON = 200


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncpg.PostgresError):
        text = " ".join(str(exc.args[0] if exc.args else exc).split())[:MAX_REASON]
        return f"{text} (SQLSTATE {exc.sqlstate})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split())[:MAX_REASON]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def severity(exc: BaseException) -> str | None:
    """The server's severity of an error it sent (``ERROR``, ``FATAL``, ``PANIC``); None
    for an error the client raised itself (a lost connection, a timeout)."""
    if not isinstance(exc, asyncpg.PostgresError):
        return None
    found = getattr(exc, "severity_en", None) or getattr(exc, "severity", None)
    return str(found).upper() if found else None


#: the client's own errors that mean the connection is gone (it may have been after the
#: statement reached the server)
_DROPPED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.PostgresConnectionError, asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError, ConnectionError, EOFError,
)


def session_lost(exc: BaseException) -> bool:
    """Whether a failure says the session is gone (the connection lost, or ended by the
    server with a ``FATAL``), rather than anything about the statement."""
    return isinstance(exc, _DROPPED) or severity(exc) in ("FATAL", "PANIC")


def _not_started(exc: BaseException) -> bool:
    """Whether asyncpg refused to start an operation (its protocol's state switch, made
    before the operation's first message is written, failed): nothing of it was sent."""
    return (isinstance(exc, asyncpg.exceptions.InternalClientError)
            and str(exc).startswith("cannot switch to state"))


def _kind(error: TargetError, failure: str) -> TargetError:
    """``error`` with its kind of failure (``TargetError.failure``: ``last_failure``)."""
    error.failure = failure
    return error


def classify_write(exc: BaseException, phase: Phase, where: str) -> TargetError:
    """What a failed batch write proves (see the module docstring).  Each error carries
    its kind of failure: ``refused`` (no session), ``rejected`` or ``not_sent`` (the
    server refused the statement), ``server_error`` (the server ended the session),
    ``timed_out``, ``dropped`` (the connection was lost) or ``ambiguous``."""
    if phase == "connect":
        return _kind(BeforeWriteError(f"not sent: cannot reach {where}: {_reason(exc)}"),
                     "refused")
    found = severity(exc)
    if phase == "uncommitted":
        sqlstate = str(getattr(exc, "sqlstate", "") or "")
        if found == "ERROR" and sqlstate[:2] in REJECTED_CLASSES:
            return RejectedWrite(f"{where} refused the batch: {_reason(exc)}; nothing was "
                                 "applied")
        return BeforeWriteError(f"{where} failed the batch before its commit: "
                                f"{_reason(exc)}; nothing was applied")
    if found == "ERROR":
        sqlstate = str(getattr(exc, "sqlstate", "") or "")
        if sqlstate[:2] in REJECTED_CLASSES:
            return RejectedWrite(f"{where} refused the batch: {_reason(exc)}; nothing was "
                                 "applied")
        return BeforeWriteError(f"{where} failed the batch's statement: {_reason(exc)}; "
                                "nothing was applied")
    if _not_started(exc):
        return _kind(BeforeWriteError(f"not sent: the session to {where} had failed, and "
                                      f"the driver started nothing on it: {_reason(exc)}"),
                     "refused")
    if isinstance(exc, TimeoutError):
        return _kind(AmbiguousWriteError(f"{where} did not answer the batch in time: it "
                                         "may have been applied"), "timed_out")
    error = AmbiguousWriteError(f"the batch may have been applied to {where}: "
                                f"{_reason(exc)}")
    if found is not None:  # FATAL, PANIC: the server ended the session
        return _kind(error, "server_error")
    return _kind(error, "dropped") if isinstance(exc, _DROPPED) else error


def classify_read(exc: BaseException, where: str, doing: str) -> TargetReadError:
    """A failed read: it says nothing about the table's rows."""
    return TargetReadError(f"{doing} from {where} failed: {_reason(exc)}")
