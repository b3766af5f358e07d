"""One injectable clock (SPEC K6).

Every decision that depends on time takes ``now`` from a :class:`Clock`; commands accept
``--now ISO-8601`` so tests and replays never sleep.  Timestamps are stored as fixed-width
UTC text (``2026-11-30T05:14:44.123456Z``) so that text order is time order in both
backends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from runner.errors import UsageError

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FixedClock:
    """A clock that says what it is told (``--now``, tests)."""

    def __init__(self, at: datetime) -> None:
        self.at = _aware(at)

    def now(self) -> datetime:
        return self.at


def _aware(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("naive datetime: runner only handles timezone-aware times")
    return at.astimezone(UTC)


def to_text(at: datetime) -> str:
    """Fixed-width UTC text; sorts as time sorts."""
    return _aware(at).strftime(_FORMAT)


def from_text(text: str) -> datetime:
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)


#: the times an option may name: from the Unix epoch to well before the year 9999, so
#: that a time plus any TTL, lease or interval runner adds stays a valid time
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def parse_now(value: str, option: str = "--now") -> datetime:
    """Parse a time option (``--now`` …): ISO-8601 with a timezone (``Z`` allowed),
    between ``EARLIEST`` and ``LATEST``."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{option} {value!r} is not an ISO-8601 time") from None
    if at.tzinfo is None:
        raise UsageError(f"{option} {value!r} has no timezone (add Z or +00:00)")
    try:
        at = at.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00
        at = EARLIEST - timedelta(days=1)
    if not EARLIEST <= at < LATEST:
        raise UsageError(f"{option} {value!r} is outside the times runner takes "
                         f"({EARLIEST.year} to {LATEST.year - 1})")
    return at
