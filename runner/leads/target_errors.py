"""The errors a target call raises (SPEC L5, L9), and what each means for the records of
the request: :class:`BeforeWriteError` (and its kinds :class:`RateLimited` and
:class:`RejectedWrite`) is the one that allows another send; :class:`AmbiguousWriteError`
and any other exception make the records uncertain; :class:`TargetReadError` says nothing
about the target's rows.  :func:`describe_failure` names a failure for the record and the
operator.

Adapters raise them at their edge; they are importable from ``runner.leads.port`` too,
where an adapter finds the rest of the contract.
"""

from __future__ import annotations

from runner.errors import RunnerError
from runner.leads.failures import FAILURES


class TargetError(RunnerError):
    """A target call failed.  Never an exit code of its own: it becomes a record state.

    ``failure``: what happened, as one of :data:`FAILURES` (a subclass has its own; an
    adapter that knows better sets it on the instance, as the HTTP target does for a
    timeout, a 5xx or a connection dropped after sending): kept with the record
    (``last_failure``) and logged, so that an operator can tell a refused connection
    from a 500 or a timeout."""

    exit_code = 69
    reason = "target_error"
    failure = "failed"


class BeforeWriteError(TargetError):
    """The request was guaranteed not dispatched: the record may be sent again (L5)."""

    reason = "before_write"
    failure = "not_sent"


class RateLimited(BeforeWriteError):
    """The target refused the request for its quota and applied nothing (HTTP 429, or 503
    with ``Retry-After``): the records may be sent again, not before ``retry_after``
    seconds when the target said how long (None: it did not say)."""

    reason = "rate_limited"
    failure = "rate_limited"

    def __init__(self, message: str = "rate limited", *,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RejectedWrite(BeforeWriteError):
    """The target refused the request as invalid and applied nothing (HTTP 400/422): the
    records become failed-safe and are retried on the backoff schedule (the target or
    its configuration may be fixed meanwhile); the message carries the target's reason."""

    reason = "rejected"
    failure = "rejected"


class AmbiguousWriteError(TargetError):
    """The request may or may not have been applied (timeout, dropped connection, …)."""

    reason = "ambiguous_write"
    failure = "ambiguous"


class TargetReadError(TargetError):
    """A read (readback or status) failed; it says nothing about the target's rows."""

    reason = "read_failed"
    failure = "read_failed"


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """A failed request's kind (one of :data:`FAILURES`) and an operator's line about it:
    the kind in words, then what the adapter said (never the record's data: adapters
    name records by write_id at most)."""
    if isinstance(exc, TargetError):
        kind = exc.failure if exc.failure in FAILURES else type(exc).failure
        detail = exc.message
    else:
        kind = ("timed_out" if isinstance(exc, TimeoutError)
                else "not_sent" if isinstance(exc, BeforeWriteError) else "failed")
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return kind, f"{FAILURES[kind]}: {detail}"
