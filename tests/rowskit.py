"""Adapters for the spreadsheet-database stand-in (``tests/procs/rows_service.py``, a real
process on a loopback port), written the way a new user writes one from the how-to —
including the two mistakes issue 29 found that the kit used to pass:

* :class:`OneUrl` puts every write_id of a read in one URL: the service refuses a URL of
  more than about 430 write_ids (431), so at runner's default batch every readback fails;
* :class:`FirstPage` asks for 200 write_ids a request and never pages: the service
  answers 25 rows a page, so 875 of a batch of 1,000 read back as "no row".

:class:`Paged` is the careful one (400 write_ids a URL, every page read); an
:class:`OneUrl` that declares ``max_read = 400`` is fixed by runner's read chunking."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import httpx

from runner.leads.models import CRMRecord
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Observation,
    TargetReadError,
    TargetRow,
    observe_rows,
)
from tests.helpers import ROOT


@contextmanager
def rows_service() -> Iterator[str]:
    """The service as a child process; yields its base URL, stops it on the way out."""
    with subprocess.Popen([sys.executable, "-m", "tests.procs.rows_service"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()  # blocks until the port is printed (or it died)
            if not line.startswith("listening on port "):
                proc.kill()
                raise AssertionError(f"the rows service did not start: {proc.stderr.read()}")
            yield f"http://127.0.0.1:{int(line.split()[-1])}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


class RowsAdapter:
    """The port over the service; subclasses differ only in how they read (``_find``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(timeout=httpx.Timeout(30.0))

    def close(self) -> None:
        self.client.close()

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]]) -> None:
        body = {"rows": [{"write_id": w, "fields": r.fields()} for r, w in items]}
        try:
            answer = self.client.post(f"{self.url}/rows", json=body)
        except httpx.ConnectError as exc:  # no connection: nothing left
            raise BeforeWriteError(f"not sent: {exc}") from None
        except httpx.HTTPError as exc:
            raise AmbiguousWriteError(f"may be written: {type(exc).__name__}") from None
        if answer.status_code != 200:  # its documentation promises nothing either way
            raise AmbiguousWriteError(f"the service answered {answer.status_code}")

    def write(self, record: CRMRecord, write_id: str) -> None:
        self.write_batch([(record, write_id)])

    def _get(self, ids: Sequence[str], **params: int) -> dict[str, Any]:
        query = "".join(f"&{k}={v}" for k, v in params.items())
        try:
            answer = self.client.get(f"{self.url}/rows?where=write_id,in,{','.join(ids)}"
                                     f"{query}")
        except httpx.HTTPError as exc:
            raise TargetReadError(f"read failed: {type(exc).__name__}") from None
        if answer.status_code != 200:
            raise TargetReadError(f"the service answered {answer.status_code}")
        doc: dict[str, Any] = answer.json()
        return doc

    def _find(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        return [TargetRow(r["write_id"], r["fields"], r["status"])
                for r in self._find(list(write_ids))]

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        return self.read_back_many([write_id])

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        for row in self._find(list(write_ids)):
            found[row["write_id"]].append(row["status"])
        return {w: observe_rows(s) for w, s in found.items()}


class OneUrl(RowsAdapter):
    """Every write_id of a read in one URL, every page read."""

    def _find(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        while True:
            doc = self._get(ids, limit=1000, offset=len(rows))
            rows.extend(doc["list"])
            if doc["pageInfo"]["isLastPage"]:
                return rows


class FirstPage(RowsAdapter):
    """200 write_ids a URL, and only the first page of each answer."""

    def _find(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        return [row for start in range(0, len(ids), 200)
                for row in self._get(ids[start : start + 200])["list"]]


class Paged(OneUrl):
    """400 write_ids a URL, every page read: what the how-to asks for."""

    def _find(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for start in range(0, len(ids), 400):
            rows.extend(super()._find(ids[start : start + 400]))
        return rows


class DeclaredOneUrl(OneUrl):
    """:class:`OneUrl` that says how many write_ids its reads take: runner and the kit
    then keep to it."""

    max_read = 400
