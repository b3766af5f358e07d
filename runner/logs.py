"""Logs for a person in a terminal, or JSON lines for a machine (SPEC K7, K8).

Every log record carries a stable ``action`` (``lead.accepted``, ``cycle.done`` …) so tests
and tools can match on it.  Records are named by key (``source_lead_id``), never by
contact fields: callers pass only the fields listed in ``SAFE_FIELDS`` and the formatter
drops anything else, so a contact alias cannot reach a log line even by mistake.
"""

from __future__ import annotations

import json
import logging
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


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        extras = _extras(record)
        action = extras.pop("action", record.name)
        tail = " ".join(f"{k}={v}" for k, v in extras.items())
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"{at} {action:<20} {level}{record.getMessage()}"
        return f"{line}  {tail}" if tail else line


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
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not to the stream it
    was when the handler was made: ``main()`` called again in one process (a test, an
    embedding program that redirects stderr) never writes into a stale stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


def configure(fmt: LogFormat = "text", level: int = logging.INFO) -> None:
    """Route the ``runner`` loggers to stderr in ``fmt``; calling it again replaces the
    handler, never adds one."""
    # neither format shows where a call was made from, nor thread or process names: skip
    # gathering them for every record (the logging HOWTO's "Optimization" section)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = StderrHandler()
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
    return f"runner: error: {message}"
