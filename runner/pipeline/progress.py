"""Job progress (SPEC P7): a one-line bar on a terminal, JSON lines otherwise.

A small standard-library bar rather than a dependency: a job shows one figure (inputs
done out of the backlog it found), on stderr, redrawn in place at most ten times a second;
when stderr is not a terminal (a pipe, a log file, CI) each update is one line of compact
JSON instead, for a machine to read.  Either way stdout keeps the job's one result line.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from runner.jsonio import dumps_line

BAR_WIDTH = 30


class Progress:
    def __init__(self, job: str, stream: TextIO | None = None, *,
                 tty: bool | None = None) -> None:
        self.job = job
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._drawn = 0.0
        self._open = False
        self._last: tuple[int, int, int] | None = None

    def update(self, done: int, total: int, pending: int, *, final: bool = False) -> None:
        if not self.tty:
            if self._last == (done, total, pending):
                return  # nothing new to say
            self._last = (done, total, pending)
            self.stream.write(dumps_line({"job": self.job, "done": done, "total": total,
                                          "pending": pending}) + "\n")
            self.stream.flush()
            return
        now = time.monotonic()
        if not final and now - self._drawn < 0.1:
            return
        self._drawn = now
        share = 1.0 if total <= 0 else min(done / total, 1.0)
        filled = int(share * BAR_WIDTH)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        self.stream.write(f"\r{self.job} [{bar}] {done}/{total} "
                          f"{share:4.0%}  pending {pending}\x1b[K")
        self.stream.flush()
        self._open = True

    def close(self) -> None:
        if self.tty and self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


class NoProgress(Progress):
    def __init__(self) -> None:
        super().__init__("", sys.stderr, tty=False)

    def update(self, done: int, total: int, pending: int, *, final: bool = False) -> None:
        return None
