"""The kit's checks of the rows a write returns (issue 29).  An adapter's ``write`` and
``write_batch`` may return the rows its target answered instead of None, and runner then
judges the batch from them and sends no readback (``runner.leads.rows.written_rows``).
Rows built from the request, or from a cache of it, would confirm a write the target
stored differently, so the kit holds an answer to what the target holds:

``answer: rows as stored``
    a write of three new records: its answer covers the request (every write_id, and no
    other) and equals, write_id by write_id, a readback through a new ``healthy()``
    adapter (each field with its type, and the status).
``answer: a held write_id's row``
    for an adapter that declares ``dedupes_write_id``: the first of those write_ids
    written again carrying another ``contact_alias``, beside a new record: the answer
    shows the row as the target holds it (the first record), not as sent, and again
    equals the readback.  Without the declaration it is skipped: writing a write_id again
    would make a second row in the target.

An adapter whose write returns None has both skipped: runner reads each batch back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runner.conformance.base import Run, batches, items, opened, working
from runner.leads.models import CRMRecord
from runner.leads.port import CRMAdapter, TargetRow, classify_readback, dedupes
from runner.leads.rows import written_rows

ROWS = "answer: rows as stored"
HELD = "answer: a held write_id's row"
ANSWER_CHECKS = (ROWS, HELD)
NO_ROWS = "the write returns no rows: runner reads every batch back"


def answer(run: Run) -> None:
    with working(run.harness.healthy) as adapter:
        written = items(3)
        given = _write(adapter, written)
        if given is None:
            for name in ANSWER_CHECKS:
                run.skip(name, NO_ROWS)
            return
        problem = _against_readback(run, given, written)
        run.check(ROWS, problem is None, f"the write's answer: {problem}")
        if not dedupes(adapter):
            run.skip(HELD, "does not declare dedupes_write_id: writing a write_id again "
                           "would make a second row")
            return
        first, write_id = written[0]
        changed = first.model_copy(update={"contact_alias": f"changed-{write_id[:8]}"})
        again = [(changed, write_id), *items(1)]
        given = _write(adapter, again)
        if given is None:
            run.skip(HELD, "the repeated write returned no rows: runner reads it back")
            return
        problem = _against_readback(run, given, again)
        held = [row for row in given if row.write_id == write_id]
        if problem is None and classify_readback(held, first, write_id) != "match":
            problem = "the held write_id's row is not the row first written"
        run.check(HELD, problem is None,
                  f"the answer to a write of a write_id the target holds: {problem} (it "
                  "must show the row as the target holds it, never the row as sent)")


def _write(adapter: CRMAdapter, records: Sequence[tuple[CRMRecord, str]]
           ) -> list[Any] | None:
    """The rows one request of ``records`` returned, as runner sends it (``write_batch``
    when the adapter batches, else ``write`` each); None when a call returned none."""
    if batches(adapter):
        given = adapter.write_batch(list(records))  # type: ignore[attr-defined]
        return None if given is None else list(given)
    rows: list[Any] = []
    for rec, write_id in records:
        one = adapter.write(rec, write_id)
        if one is None:
            return None
        rows += list(one)
    return rows


def _against_readback(run: Run, given: Sequence[Any],
                      records: Sequence[tuple[CRMRecord, str]]) -> str | None:
    """None when ``given`` covers the request and equals a fresh readback of each of its
    write_ids; else what differs, in words (no value is shown: rows hold contact
    fields)."""
    write_ids = list(dict.fromkeys(write_id for _, write_id in records))
    by_id = written_rows(given, write_ids)
    if by_id is None or isinstance(by_id, str):
        return by_id or "no rows"
    with opened(run.harness.healthy) as reader:
        read = {w: list(reader.read_back(w)) for w in write_ids}
    differ = [w for w in write_ids if sorted(map(_exact, by_id[w])) != sorted(
        map(_exact, read[w]))]
    if not differ:
        return None
    w = differ[0]
    return (f"{len(differ)} of {len(write_ids)} write_ids differ from a readback (the "
            f"first: {len(by_id[w])} row(s) in the answer, {len(read[w])} read back"
            f"{_how(by_id[w], read[w])})")


def _exact(row: TargetRow) -> str:
    """A row's fields with their types, and its status, comparable and sortable."""
    return repr((sorted((name, type(value).__name__, repr(value))
                        for name, value in row.fields.items()), row.status))


def _how(given: Sequence[TargetRow], read: Sequence[TargetRow]) -> str:
    if len(given) != 1 or len(read) != 1:
        return ""
    a, b = given[0], read[0]
    names = sorted(name for name in {*a.fields, *b.fields}
                   if (type(a.fields.get(name)), a.fields.get(name))
                   != (type(b.fields.get(name)), b.fields.get(name)))
    if a.status != b.status:
        names.append("status")
    return f"; they differ in {', '.join(names)}" if names else ""
