"""Logs for a person in a terminal, or JSON lines for a machine (SPEC K7, K8).

Every log record carries a stable ``action`` (``lead.accepted``, ``cycle.done`` …) so tests
and tools can match on it.  Records are named by key (``source_lead_id``), never by
contact fields: callers pass only the fields listed in ``SAFE_FIELDS`` and the formatter
drops anything else, so a contact alias cannot reach a log line even by mistake.

Every line is dated: text lines start with an ISO 8601 UTC time with the date and ``Z``
(``2026-11-30T16:45:29.247Z``), JSON lines carry ``ts`` (also the error line a failed
command prints).  Lines go to stderr, or with ``--log-file PATH`` to that file: opened
for appending, ``0600``, never through a symlink, and reopened (at the next line) after
SIGHUP, so ``logrotate`` can move it away and signal, without ``copytruncate``.  The
one error line of a failed command goes to stderr, and to the log file too when there is
one.  The whole set-up lives here (``configure``, ``close``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from types import FrameType
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]

#: the only extra fields a log line may carry
SAFE_FIELDS = (
    "action", "key", "write_id", "state", "from_state", "to_state", "attempts",
    "reconcile_attempts", "count", "cycle", "pid", "signal", "reason", "kind", "seconds",
    "task", "stage", "worker", "candidate", "error", "version", "store", "scope", "target",
    "interval", "heartbeat", "workers", "cycles", "moved", "keys", "next_attempt_at",
    "repeats", "replication", "standbys", "port", "status", "rows",
)

LEVELS = ("debug", "info", "warning", "error")


#: the last whole second :func:`stamp` wrote and its text up to the seconds: every line
#: of a busy second shares it (``strftime`` was a sixth of a line's cost, issue 16); one
#: tuple, replaced whole, so a thread never sees half of it
_second: tuple[int, str] = (-1, "")


def stamp(created: float, digits: int = 3) -> str:
    """An ISO 8601 UTC time with the date and ``Z``: ``2026-11-30T16:45:29.247Z``
    (``digits``: 3 or 6 fractional digits)."""
    global _second
    second = math.floor(created)
    micro = round((created - second) * 1_000_000)
    if micro >= 1_000_000:  # rounds up to the next second, as datetime does
        second, micro = second + 1, micro - 1_000_000
    cached = _second
    if cached[0] != second:
        cached = _second = (second, datetime.fromtimestamp(second, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{micro:06d}"[: 20 + digits] + "Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    fields = vars(record)  # extra fields are instance attributes
    return {name: fields[name] for name in SAFE_FIELDS if name in fields}


#: what a text line never prints raw: C0 and C1 controls (newline and ESC among them),
#: DEL, Unicode line and paragraph separators, and bidirectional overrides and isolates;
#: a key holding them could forge a log line or drive the terminal
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every character in ``_UNSAFE`` written as a ``\\xNN`` or ``\\uNNNN``
    escape, so that one text log line stays one line of plain text."""
    return _UNSAFE.sub(_escaped, text)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        at = stamp(record.created)
        extras = _extras(record)
        action = extras.pop("action", record.name)
        tail = " ".join(f"{k}={v}" for k, v in extras.items())
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"{at} {action:<20} {level}{record.getMessage()}"
        return escape(f"{line}  {tail}" if tail else line)


#: one encoder for every line (``json.dumps`` with options builds a new one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": stamp(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(_extras(record))
        return _ENCODER.encode(doc)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is written (not when the handler
    was made), so ``main(argv)`` called in process, under a test's captured streams, never
    writes to a stream that an earlier call's capture has closed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        return None


class LogFile(logging.Handler):
    """Appends lines to a file of its own: ``0600``, created if absent, never through a
    symlink.  :meth:`request_reopen` (called from the SIGHUP handler: it only sets a flag)
    makes the next line reopen the path first, so a rotated file is let go of."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._reopen = False
        self._file: TextIO = open_log_file(path)

    def request_reopen(self) -> None:
        self._reopen = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if self._reopen:
                self._reopen_now()
            self._file.write(line + "\n")
            self._file.flush()
        except Exception:  # noqa: BLE001 - logging's own convention: never raise
            self.handleError(record)

    def _reopen_now(self) -> None:
        self._reopen = False
        try:
            fresh = open_log_file(self.path)
        except Exception as exc:  # noqa: BLE001 - keep the old file rather than lose lines
            print(f"runner: cannot reopen the log file {self.path!r} ({exc}); "
                  "still writing to the old one", file=sys.stderr)
            return
        old, self._file = self._file, fresh
        old.close()
        note = logging.makeLogRecord({
            "name": "runner.logs", "levelno": logging.INFO, "levelname": "INFO",
            "msg": "log file reopened (SIGHUP)", "action": "log.reopened"})
        self._file.write(self.format(note) + "\n")

    def write_line(self, line: str) -> None:
        with self.lock or threading.Lock():
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self.lock or threading.Lock():
            self._file.close()
        super().close()


def open_log_file(path: str) -> TextIO:
    """``path`` opened for appending, ``0600``.  A symlink is ``UnsafeLocation`` (exit 77),
    any other failure a ``UsageError`` (exit 2)."""
    from runner.errors import UnsafeLocation, UsageError

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLocation(f"refusing a symlinked --log-file {path!r}") from None
        raise UsageError(f"cannot open --log-file {path!r}: {exc.strerror}") from None
    with contextlib.suppress(OSError):  # not ours to change (another user's file): used as is
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")


class _State:
    fmt: LogFormat = "text"
    file: LogFile | None = None
    previous_hup: Any = None


def configure(fmt: LogFormat = "text", level: int | str = logging.INFO,
              log_file: str | None = None) -> None:
    """Send runner's log lines to stderr, or to ``log_file`` (reopened on SIGHUP)."""
    close()
    # neither format shows where a call was made from, nor thread or process names: skip
    # gathering them for every record (the logging HOWTO's "Optimization" section)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler: logging.Handler = StderrHandler() if log_file is None else LogFile(log_file)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("runner")
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    root.propagate = False
    _State.fmt = fmt
    if isinstance(handler, LogFile):
        _State.file = handler
        if threading.current_thread() is threading.main_thread():
            _State.previous_hup = signal.signal(signal.SIGHUP, _on_sighup)


def _on_sighup(_signum: int, _frame: FrameType | None) -> None:
    if _State.file is not None:
        _State.file.request_reopen()


def close() -> None:
    """Close the log file, if any, and give SIGHUP back its previous handler."""
    file, _State.file = _State.file, None
    if file is None:
        return
    if _State.previous_hup is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, _State.previous_hup)
        _State.previous_hup = None
    logging.getLogger("runner").handlers[:] = [StderrHandler()]
    file.close()


def error_line(message: str, *, fmt: LogFormat, reason: str) -> str:
    """The one line a failed command prints on stderr."""
    if fmt == "json":
        doc = {"ts": stamp(datetime.now(UTC).timestamp(), 6), "level": "error",
               "action": "command.failed", "reason": reason, "message": message}
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return escape(f"runner: error: {message}")


def report_error(message: str, *, fmt: LogFormat, reason: str) -> None:
    """A failed command's one line: on stderr, and in the log file when there is one
    (there as a dated log line, so the file keeps why the run ended)."""
    print(error_line(message, fmt=fmt, reason=reason), file=sys.stderr)
    if _State.file is not None:
        record = logging.makeLogRecord({
            "name": "runner", "levelno": logging.ERROR, "levelname": "ERROR",
            "msg": message, "action": "command.failed", "reason": reason})
        _State.file.write_line(_State.file.format(record))


class Repeats:
    """Lines that say the same thing again, rate-limited (issue 29: a target down for an
    hour must not write a warning per cycle): the first line of a kind is logged, then at
    most one per ``window`` seconds, each saying how many like it were left out since the
    last one.  Thread-safe (a dispatch run logs from its worker thread)."""

    def __init__(self, window: float = 60.0,
                 monotonic: Callable[[], float] | None = None) -> None:
        import time

        self.window = window
        self._monotonic = monotonic or time.monotonic
        self._seen: dict[Hashable, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def admit(self, key: Hashable) -> int | None:
        """None: leave this line out (one like it was logged less than a window ago);
        else log it, saying how many like it were left out since (0: none)."""
        now = self._monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            self._seen[key] = (now, 0)
            return 0 if last is None else last[1]

    def forget(self, key: Hashable) -> None:
        """The condition ended (a read that failed succeeds): its next line is logged."""
        with self._lock:
            self._seen.pop(key, None)
