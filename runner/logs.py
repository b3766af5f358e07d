"""Logs for a person in a terminal, or JSON lines for a machine (SPEC K7, K8).

Every log record carries a stable ``action`` (``lead.accepted``, ``cycle.done`` …) so tests
and tools can match on it.  Records are named by key (``source_lead_id``), never by
contact fields: callers pass only the fields listed in ``SAFE_FIELDS`` and the formatter
drops anything else, so a contact alias cannot reach a log line even by mistake.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]

#: the only extra fields a log line may carry
SAFE_FIELDS = (
    "action", "key", "write_id", "state", "from_state", "to_state", "attempts",
    "reconcile_attempts", "count", "cycle", "pid", "signal", "reason", "kind", "seconds",
    "task", "stage", "worker", "candidate", "error",
)


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
        at = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
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
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
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


def configure(fmt: LogFormat = "text", level: int = logging.INFO) -> None:
    # neither format shows where a call was made from, nor thread or process names: skip
    # gathering them for every record (the logging HOWTO's "Optimization" section)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler: logging.Handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("runner")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def error_line(message: str, *, fmt: LogFormat, reason: str) -> str:
    """The one line a failed command prints on stderr."""
    if fmt == "json":
        doc = {"level": "error", "action": "command.failed", "reason": reason,
               "message": message}
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return escape(f"runner: error: {message}")
