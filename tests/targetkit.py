"""Helpers for tests of the HTTP target: a real ``runner target-serve`` child process on an
ephemeral loopback port, and counting the rows of its sheet."""

from __future__ import annotations

import re
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import Child


@dataclass
class TargetServer:
    child: Child
    port: int
    store: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/sheet"

    def rows(self) -> list[tuple[str, str]]:
        """(write_id, source_lead_id) of every row of the sheet, in order."""
        with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True) as conn:
            return [(str(w), str(s)) for w, s in conn.execute(
                "SELECT write_id, source_lead_id FROM sheet ORDER BY row_id")]


_PORT = re.compile(r"(?:listening on|refusing connections on) port (\d+)")


@contextmanager
def target_server(workdir: Path, *args: str | Path, store: Path | None = None,
                  env: dict[str, str] | None = None) -> Iterator[TargetServer]:
    """``runner target-serve`` as a child process; stopped with SIGTERM (and checked to
    exit 0) on the way out."""
    store = store or workdir / "sheet.db"
    child = Child("target-serve", "--listen", "127.0.0.1:0", "--store", store, *args,
                  env=env)
    try:
        child.wait_for(lambda c: any(_PORT.search(line) for line in c.err), 30,
                       "the server's port")
        port = next(int(m.group(1)) for line in child.err if (m := _PORT.search(line)))
        yield TargetServer(child, port, store)
        child.signal(signal.SIGTERM)
        assert child.finish() == 0, child.err
    finally:
        child.kill()
