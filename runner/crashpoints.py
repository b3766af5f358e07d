"""Named crash points around every commit and every send (issue 8, SPEC L10).

Why: "no duplicate external write, no lost record, whatever dies when" is only a promise
until every "when" has been tried.  Each place where a process could die with something
half done — between a commit and the next step, between a send and its record — has a
name here, and the tasks call :func:`hit` with that name at that line.  When the point is
armed the process exits at once with ``os._exit(73)``: no ``finally``, no rollback, no
flush, as close to a power cut as a process can get.  ``bench/chaos.py`` arms them at
random in real worker processes and checks the store after every restart.

Arming, for a whole process:

* ``RUNNER_CRASH_AT=<point>`` (and optionally ``RUNNER_CRASH_AFTER=<n>``: fire at the
  n-th hit, default 1), read once at import;
* ``--fault crash-at:<point>`` (or ``crash-at:<point>@<n>``) on ``once``, ``start`` and
  ``poll-status`` (``$RUNNER_CRASH_AT`` reaches ``accept`` and ``sweep`` too).

Unset, a point costs one function call and one comparison.  Tests that simulate a crash
in process use :func:`armed` with an ``action`` that raises instead of exiting.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

from runner.errors import UsageError

POINT_ENV = "RUNNER_CRASH_AT"
AFTER_ENV = "RUNNER_CRASH_AFTER"
CRASH_EXIT = 73

#: every crash point, with where it sits; the tasks call ``hit`` with these names
POINTS: Mapping[str, str] = {
    "accept.before-commit": "an event is validated; its insert has not run",
    "accept.after-commit": "the insert committed; the answer is not given yet",
    "recover.before-commit": "the lock is held; in-flight records are not yet uncertain",
    "recover.after-commit": "in-flight records were made uncertain",
    "reconcile.before-commit": "a readback returned; its verdict is not recorded",
    "reconcile.after-commit": "a reconcile verdict (and maybe confirmed) committed",
    "dispatch.after-in-flight": "the in-flight mark (of a record or a whole batch) committed; "
                                "the target is not called",
    "dispatch.after-write": "the target write (of a record or a batch) returned; nothing read "
                            "back or recorded",
    "dispatch.batch-applied": "the synthetic target, or the PostgreSQL table target, "
                              "committed a batch; its answer is not returned yet",
    "dispatch.batch-mid-readback": "the synthetic target has read back part of a batch's rows",
    "dispatch.before-confirm": "the send's outcome is known; it is not committed (it commits "
                               "with the next record's in-flight mark, or alone at the end)",
    "dispatch.after-confirm": "the send's outcome (confirmed or other) committed",
    "resolve.before-commit": "resolve --all read a chunk back; its decisions are not "
                             "committed",
    "resolve.after-commit": "a chunk of resolve --all's decisions committed",
    "poll.before-apply": "status reads returned; the pass (observations, health) not stored",
    "poll.after-apply": "a poll pass's observations and poll health committed",
    "sweep.before-commit": "a candidate sweep's updates are written, not committed",
    "sweep.after-commit": "a candidate sweep committed; its result not reported",
}

Action = Callable[[str], object]


def _exit(point: str) -> NoReturn:
    os.write(2, f"runner: simulated crash at {point} (exit {CRASH_EXIT})\n".encode())
    os._exit(CRASH_EXIT)


_point: str | None = None
_after = 1
_hits = 0
_action: Action = _exit
_env_error: str | None = None


def hit(point: str) -> None:
    """Mark that execution reached ``point``; exits the process if it is armed there."""
    global _hits
    if _point is None or point != _point:
        return
    _hits += 1
    if _hits >= _after:
        _action(point)


def _parse(point: str, after: str | int | None) -> tuple[str, int]:
    if point not in POINTS:
        raise UsageError(f"unknown crash point {point!r} (known: {', '.join(POINTS)})")
    try:
        n = int(after) if after not in (None, "") else 1
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"crash point hit count must be a positive integer, not {after!r}")
    return point, n


def arm(point: str, after: str | int | None = None, action: Action | None = None) -> None:
    """Arm ``point`` to fire at its ``after``-th hit (default: the first)."""
    global _point, _after, _hits, _action, _env_error
    _point, _after = _parse(point, after)
    _hits, _action, _env_error = 0, action or _exit, None


def disarm() -> None:
    global _point, _after, _hits, _action, _env_error
    _point, _after, _hits, _action, _env_error = None, 1, 0, _exit, None


@contextmanager
def armed(point: str, after: int | str | None = 1, action: Action | None = None
          ) -> Iterator[None]:
    """Arm ``point`` for the duration of a block, then restore what was armed before."""
    global _point, _after, _hits, _action, _env_error
    saved = (_point, _after, _hits, _action, _env_error)
    arm(point, after, action)
    try:
        yield
    finally:
        _point, _after, _hits, _action, _env_error = saved


def parse_option(value: str) -> tuple[str, int]:
    """``crash-at:<point>[@<n>]`` -> (point, n); UsageError if the point is unknown."""
    point, _, after = value.removeprefix("crash-at:").partition("@")
    return _parse(point, after or None)


def check_environment() -> None:
    """Raise UsageError if ``$RUNNER_CRASH_AT`` names no known point (the CLI calls this,
    so a typo in a chaos run is an error instead of a run that never crashes)."""
    if _env_error is not None:
        raise UsageError(_env_error)


def _from_environment() -> None:
    global _env_error
    point = os.environ.get(POINT_ENV)
    if not point:
        return
    try:
        arm(point, os.environ.get(AFTER_ENV))
    except UsageError as exc:
        _env_error = f"${POINT_ENV}: {exc.message}"


_from_environment()
