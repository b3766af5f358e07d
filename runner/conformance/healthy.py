"""The kit's checks of a healthy target: exact round trips, and batches and reads at the
sizes runner sends (issue 29: a kit that checked 3 records passed adapters that strand
every record of a default batch)."""

from __future__ import annotations

from collections.abc import Sequence

from runner.conformance.base import (
    Run,
    absent_id,
    attempt,
    batches,
    before_work,
    grouped,
    items,
    judged,
    opened,
    raised_words,
    reads_many,
)
from runner.errors import UsageError
from runner.leads.models import CRMRecord
from runner.leads.port import (
    CRMAdapter,
    Missing,
    ReadFailure,
    Snapshot,
    TargetRow,
    max_batch,
    max_read,
)

BATCH = "healthy: batch"
READ_MANY = "healthy: read_back_many"
STATUS_MANY = "healthy: status of many"


def healthy(run: Run) -> None:
    with opened(run.harness.healthy) as adapter:
        raised = attempt(lambda: before_work(adapter))
        if raised is not None:
            run.check("healthy: checks before work", False,
                      f"prepare_writes or target_id {raised_words(raised)}: runner would "
                      "not start")
            return
        run.guarded("healthy: write then read back", lambda: _roundtrip(run, adapter))
        run.guarded("healthy: exact fields", lambda: _exact(run, adapter))
        run.guarded("healthy: unknown write_id", lambda: _unknown(run, adapter))
        run.guarded(BATCH, lambda: _sizes(run, adapter))
        run.guarded("healthy: status", lambda: _status(run, adapter))
        run.guarded("healthy: identity", lambda: _identity(run, adapter))


def _roundtrip(run: Run, adapter: CRMAdapter) -> None:
    written = items(1)
    adapter.write(*written[0])
    found = judged({w: list(adapter.read_back(w)) for _, w in written}, written)
    run.check("healthy: write then read back", found is None,
              f"the readback of the row just written: {found}")
    run.check("healthy: read back by another adapter (not a cache)",
              run.read_other(written) is None,
              "a second healthy() adapter does not find the row exactly")


def _exact(run: Run, adapter: CRMAdapter) -> None:
    written = items(1, alias=None, is_test=False)
    adapter.write(*written[0])
    found = judged({w: list(adapter.read_back(w)) for _, w in written}, written)
    run.check("healthy: exact fields", found is None,
              f"a record with contact_alias None and is_test False: {found} (fields must "
              "come back with their types)")


def _unknown(run: Run, adapter: CRMAdapter) -> None:
    rows = list(adapter.read_back(absent_id()))
    run.check("healthy: unknown write_id", rows == [],
              f"read_back of a write_id never written returned {len(rows)} rows")


def _limit(value: int | None) -> float:
    return float("inf") if value is None else value


def _sizes(run: Run, adapter: CRMAdapter) -> None:
    """One batch at runner's size, read back in one call, and as many statuses in one
    call: ``healthy: batch``, ``healthy: read_back_many``, ``healthy: status of many``.

    The sizes are runner's: a batch is the harness's ``batch_size`` (runner's default),
    at most the adapter's ``max_batch``; a readback carries as many write_ids, at most its
    ``max_read``; a status read carries the harness's ``poll_limit``, at most ``max_read``.
    """
    try:
        largest = max_batch(adapter)
    except UsageError as exc:
        run.check(BATCH, False, exc.message)
        run.skip(READ_MANY, "max_batch is not valid")
        run.skip(STATUS_MANY, "max_batch is not valid")
        return
    try:
        read_cap = max_read(adapter)
    except UsageError as exc:
        run.skip(BATCH, "max_read is not valid")
        run.check(READ_MANY, False, exc.message)
        run.skip(STATUS_MANY, "max_read is not valid")
        return
    harness = run.harness
    batch_n = int(min(harness.batch_size, _limit(largest)))
    read_n = int(min(batch_n, _limit(read_cap)))
    status_n = int(min(harness.poll_limit, _limit(read_cap)))
    written = items(max(batch_n, status_n))
    failed = _write_all(run, adapter, written, batch_n)
    if failed is not None:
        run.check(BATCH, False, failed)
        run.skip(READ_MANY, "the batch write failed: nothing to read back")
        run.skip(STATUS_MANY, "the batch write failed: nothing to read back")
        return
    _read_many(run, adapter, written, batch_n, read_n)
    _status_many(run, adapter, written[:status_n])


def _write_all(run: Run, adapter: CRMAdapter, written: Sequence[tuple[CRMRecord, str]],
               batch_n: int) -> str | None:
    """The first ``batch_n`` records in one write_batch (the check), the rest as runner
    would send them (only to have rows to read); without write_batch, one write each.
    Returns why the batch write failed (None: it did not)."""
    if not batches(adapter):
        run.skip(BATCH, "no write_batch: runner sends one record per request")
        for rec, write_id in written:
            adapter.write(rec, write_id)
        return None
    write_batch = adapter.write_batch  # type: ignore[attr-defined]
    first = list(written[:batch_n])
    raised = attempt(lambda: write_batch(first))
    if raised is not None:
        return (f"one write_batch of {batch_n} records {raised_words(raised)} (runner "
                f"sends up to {batch_n} records in one call; a target that takes fewer "
                "declares max_batch)")
    for start in range(batch_n, len(written), batch_n):
        write_batch(list(written[start : start + batch_n]))
    return None


def _read_many(run: Run, adapter: CRMAdapter, written: Sequence[tuple[CRMRecord, str]],
               batch_n: int, read_n: int) -> None:
    """``healthy: read_back_many``: one call of ``read_n`` write_ids (one of them never
    written, when there is room) returns every row, exactly once, exact.  ``healthy:
    batch``: every row of the batch reads back exactly (read as runner reads it, in calls
    of ``read_n``; one read_back each if those fail, so a write is judged on its own)."""
    batch = list(written[:batch_n])
    if not reads_many(adapter):
        run.skip(READ_MANY, "no read_back_many: runner reads back one record per request")
        if batches(adapter):
            found = judged({w: list(adapter.read_back(w)) for _, w in batch}, batch)
            run.check(BATCH, found is None, f"the batch of {batch_n} read back: {found}")
        return
    many = adapter.read_back_many  # type: ignore[attr-defined]
    asked = list(batch[: read_n - 1] if read_n > 1 else batch[:1])
    absent = [absent_id()] if read_n > 1 else []
    ids = [w for _, w in asked] + absent
    rows: list[TargetRow] = []
    raised = attempt(lambda: rows.extend(many(ids)))
    if raised is not None:
        run.check(READ_MANY, False, f"one read_back_many of {len(ids)} write_ids "
                  f"{raised_words(raised)} (runner reads back up to {len(ids)} write_ids in "
                  "one call; a target that takes fewer declares max_read)")
    else:
        by_id = grouped(rows)
        found = judged(by_id, asked)
        answered = sum(w in by_id for _, w in asked)
        if found is not None and 0 < answered < len(asked):
            found += (f"; rows came back for only {answered} write_ids (does it read every "
                      "page of the answer?)")
        strays = sum(len(by_id.get(w, ())) for w in absent)
        run.check(READ_MANY, found is None and not strays,
                  f"one read_back_many of {len(ids)} write_ids: "
                  + (found or f"{strays} rows for a write_id never written"))
    if not batches(adapter):
        return
    by_id = {}
    try:
        for start in range(0, len(batch), read_n):
            by_id.update(grouped(list(many([w for _, w in batch[start : start + read_n]]))))
    except Exception:  # noqa: BLE001 - judged above; the batch is read one by one here
        by_id = {w: list(adapter.read_back(w)) for _, w in batch}
    found = judged(by_id, batch)
    run.check(BATCH, found is None, f"the batch of {batch_n} read back: {found}")


def _status_many(run: Run, adapter: CRMAdapter,
                 written: Sequence[tuple[CRMRecord, str]]) -> None:
    """One observe_status of every written row: a snapshot each (a ``Missing`` for a row
    that is there would make runner mark a delivered record missing for good)."""
    ids = [w for _, w in written]
    seen: dict[str, object] = {}
    raised = attempt(lambda: seen.update(adapter.observe_status(ids)))
    if raised is not None:
        run.check(STATUS_MANY, False, f"one observe_status of {len(ids)} write_ids "
                  f"{raised_words(raised)} (runner reads up to {len(ids)} statuses in one "
                  "call, --poll-limit; a target that takes fewer declares max_read)")
        return
    missing = sum(isinstance(seen.get(w), Missing) for w in ids)
    failed = sum(isinstance(seen.get(w), ReadFailure) for w in ids)
    unanswered = sum(not isinstance(seen.get(w), Snapshot | Missing | ReadFailure)
                     for w in ids)
    parts = []
    if missing:
        parts.append(f"{missing} Missing for rows that are there (runner would mark those "
                     "records confirmed_then_missing for good; read every page)")
    if failed:
        parts.append(f"{failed} read failures")
    if unanswered:
        parts.append(f"{unanswered} not answered")
    run.check(STATUS_MANY, not parts,
              f"one observe_status of {len(ids)} written rows: {', '.join(parts)}")


def _status(run: Run, adapter: CRMAdapter) -> None:
    written = items(1)
    adapter.write(*written[0])
    absent = absent_id()
    seen = adapter.observe_status([written[0][1], absent])
    run.check("healthy: status of a row", isinstance(seen.get(written[0][1]), Snapshot),
              f"observe_status of a written row gave {seen.get(written[0][1])!r}")
    run.check("healthy: status of no row", isinstance(seen.get(absent), Missing),
              f"observe_status of a write_id never written gave {seen.get(absent)!r} "
              "(expected Missing: the target says it has no such row)")


def _identity(run: Run, adapter: CRMAdapter) -> None:
    target_id = getattr(adapter, "target_id", None)
    if not callable(target_id):
        run.skip("healthy: identity", "no target_id: the target cannot be pinned")
        return
    first = target_id()
    adapter.write(*items(1)[0])
    with opened(run.harness.healthy) as other:
        again = getattr(other, "target_id", lambda: None)()
    run.check("healthy: identity", first is not None and first == target_id() == again,
              f"target_id is not stable ({first!r}, then {again!r})")
