"""What an adapter declares about its target: its limits and its promises (issue 16, 29).

Each is an optional attribute of the adapter, read and checked here; a value of the wrong
kind is one clear usage error (exit 2) when the port is made, before anything is sent::

    max_batch: int          the most records one write_batch or one read_back_many may
                            carry; runner sends no more, whatever its batch size
    max_read: int           the most write_ids one read_back_many and one observe_status
                            may carry (a URL that holds them all, a query's bound on
                            parameters, a page size); runner splits every read into
                            requests of no more: the readback after a batch, reconcile,
                            the poll pass, resolve (``CRMRecordPort``)
    dedupes_write_id: bool  True: a second write carrying a write_id the target already
                            holds never makes a second row (a unique key, an upsert by
                            external id, an Idempotency-Key), and its answer is not an
                            error that strands the record (SPEC E7).  The conformance kit
                            proves it (``runner.testing``: ``Report.dedupe_proven``)
                            before you declare it.  Then, and only then, runner sends
                            again an uncertain record whose fresh readback shows no row
                            (on the backoff schedule)

A declaration is a promise the kit checks; an adapter that declares nothing gets runner's
behaviour for a target that declares nothing: no limit of its own, and no resend of an
uncertain record.
"""

from __future__ import annotations

import functools
import inspect

from runner.errors import UsageError


def _whole(adapter: object, name: str) -> int | None:
    value = getattr(adapter, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"the target adapter's {name} must be a positive whole number, "
                         f"not {value!r}")
    return value


def max_batch(adapter: object) -> int | None:
    """The adapter's own largest batch (its ``max_batch``; None: it has none); refuses a
    value that is not a positive whole number."""
    return _whole(adapter, "max_batch")


def max_read(adapter: object) -> int | None:
    """The most write_ids one read of the adapter may carry (its ``max_read``; None: it
    has no limit of its own); refuses a value that is not a positive whole number."""
    return _whole(adapter, "max_read")


def dedupes(adapter: object) -> bool:
    """Whether the adapter declares that it deduplicates by write_id (its
    ``dedupes_write_id``; absent: it does not); refuses a value that is not a bool."""
    value = getattr(adapter, "dedupes_write_id", False)
    if not isinstance(value, bool):
        raise UsageError(f"the target adapter's dedupes_write_id must be True or False, "
                         f"not {value!r}")
    return value


def marks(adapter: object) -> bool:
    """Whether the adapter declares that its target keeps batch marks (``marks_batches``;
    absent: it does not); refuses a value that is not a bool, or a declaration without the
    four methods.  An adapter whose ``write_batch`` takes no ``mark`` (a subclass or a
    wrapper of a marking target that overrides it, written before marks) does not mark:
    its batches are sent as before."""
    value = getattr(adapter, "marks_batches", False)
    if not isinstance(value, bool):
        raise UsageError(f"the target adapter's marks_batches must be True or False, "
                         f"not {value!r}")
    if not value:
        return False
    lacking = [name for name in ("read_mark", "write_batch", "raise_mark", "read_by_keys")
               if not callable(getattr(adapter, name, None))]
    if lacking:
        raise UsageError("the target adapter declares marks_batches but has no "
                         + ", ".join(lacking))
    write_batch: object = getattr(adapter, "write_batch", None)
    return _takes_mark(getattr(write_batch, "__func__", write_batch))


@functools.lru_cache(maxsize=64)
def _takes_mark(function: object) -> bool:
    """Whether a ``write_batch`` takes a ``mark`` keyword (read once per function)."""
    try:
        parameters = inspect.signature(function).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return "mark" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
