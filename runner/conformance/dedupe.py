"""The dedupe proof (SPEC E7, issue 29): an adapter that declares ``dedupes_write_id =
True`` lets runner send an uncertain record again once its fresh readback shows no row.
That is safe only if a second write of a write_id can never make a second row — also
when the first is still on its way (a request abandoned by a crash or a timeout may land
after the resend) — and if the second write's answer does not strand the record.  The
kit proves each of these on the real target before runner relies on the claim:

``dedupe: twice in one batch``
    one write_batch carrying the same write_id twice makes one row.
``dedupe: twice in two batches``
    a write_id written, then written again in a second call through another adapter (a
    resend comes after a restart, from another process) together with a new record,
    makes one row, and the new record's row is there too.
``dedupe: twice in two concurrent calls``
    two ``healthy()`` adapters in two threads, released together by a barrier, each
    writing the same write_id: one row (and not both calls say "nothing was sent").
``dedupe: the repeated write's answer``
    the second call of the two batches does not raise ``BeforeWriteError`` (a record
    refused every time it is sent again would be failed-safe forever), and a readback
    after it finds exactly one row equal to the record.

Every readback is through a new ``healthy()`` adapter and exact (types included).  An
adapter that does not declare the claim has these checks skipped, and runner never
resends an uncertain record for it.
"""

from __future__ import annotations

import threading

from runner.conformance.base import (
    Run,
    attempt,
    batches,
    before_work,
    items,
    opened,
    raised_words,
    working,
    write,
)
from runner.errors import UsageError
from runner.leads.port import BeforeWriteError, CRMAdapter, dedupes

DECLARED = "dedupe: declared"
ONE_BATCH = "dedupe: twice in one batch"
TWO_BATCHES = "dedupe: twice in two batches"
CONCURRENT = "dedupe: twice in two concurrent calls"
ANSWER = "dedupe: the repeated write's answer"
PROOF = (ONE_BATCH, TWO_BATCHES, CONCURRENT, ANSWER)
NOT_DECLARED = ("does not declare dedupes_write_id: runner will not resend uncertain "
                "records for it")
#: how long the two concurrent calls may take (a call still running then fails the check)
CALL_TIMEOUT = 60.0


def dedupe(run: Run) -> None:
    with opened(run.harness.healthy) as adapter:
        try:
            before_work(adapter)  # what it declares may come from its target
            declared = dedupes(adapter)
        except Exception as exc:  # noqa: BLE001 - a bad declaration, or no target to ask
            why = exc.message if isinstance(exc, UsageError) else (
                f"the checks before work {raised_words(exc)}")
            run.check(DECLARED, False, why)
            for name in PROOF:
                run.skip(name, "not reached: the declaration could not be read")
            run.report.dedupe = "not_proven"
            return
        if not declared:
            for name in (DECLARED, *PROOF):
                run.skip(name, NOT_DECLARED)
            run.report.dedupe = "not_declared"
            return
        run.check(DECLARED, True)
        run.guarded(ONE_BATCH, lambda: _one_batch(run, adapter))
        run.guarded(TWO_BATCHES, lambda: _two_batches(run, adapter))
    run.guarded(CONCURRENT, lambda: _concurrent(run))
    outcomes = {c.name: c for c in run.report.checks if c.name in PROOF}
    proven = all(name in outcomes and (outcomes[name].outcome == "passed" or (
        name == ONE_BATCH and outcomes[name].outcome == "skipped")) for name in PROOF)
    run.report.dedupe = "proven" if proven else "not_proven"


def _one_batch(run: Run, adapter: CRMAdapter) -> None:
    if not batches(adapter):
        run.skip(ONE_BATCH, "no write_batch: runner never sends a write_id twice in one "
                            "request")
        return
    (rec, write_id), = items(1)
    raised = attempt(lambda: adapter.write_batch(  # type: ignore[attr-defined]
        [(rec, write_id), (rec, write_id)]))
    found = run.read_other([(rec, write_id)])
    run.check(ONE_BATCH, raised is None and found is None,
              f"a write_batch holding one write_id twice {raised_words(raised)}; the "
              f"readback: {found or 'one row, exact'}")


def _two_batches(run: Run, adapter: CRMAdapter) -> None:
    repeated, new = items(2)
    first = attempt(lambda: write(adapter, [repeated]))
    if first is not None:
        run.check(TWO_BATCHES, False, f"the first write {raised_words(first)}")
        run.skip(ANSWER, "not reached: the first write failed")
        return
    with working(run.harness.healthy) as again:
        second_items = [repeated, new] if batches(again) else [repeated]
        second = attempt(lambda: write(again, second_items))
    found = run.read_other([repeated])
    found_new = run.read_other([new]) if len(second_items) == 2 else None
    parts = []
    if found is not None:
        parts.append(f"the write_id written twice: {found}")
    if found_new is not None:
        parts.append(f"the new record sent with it: {found_new} (a batch holding a "
                     "write_id the target has must still write the others)")
    run.check(TWO_BATCHES, not parts,
              f"{'; '.join(parts)} (the second call {raised_words(second)})")
    _answer(run, second, found)


def _answer(run: Run, second: Exception | None, found: str | None) -> None:
    if isinstance(second, BeforeWriteError):
        run.check(ANSWER, False,
                  f"the repeated write {raised_words(second)}: runner would keep the "
                  "record failed_safe and send it again, refused every time; answer a "
                  "write_id the target already holds as written")
        return
    run.check(ANSWER, found is None,
              f"after the repeated write ({raised_words(second)}), the readback: {found}")


def _concurrent(run: Run) -> None:
    (rec, write_id), = items(1)
    barrier = threading.Barrier(2, timeout=CALL_TIMEOUT)
    raised: list[BaseException | None] = [None, None]
    done = [False, False]

    def call(i: int, adapter: CRMAdapter) -> None:
        try:
            barrier.wait()
            write(adapter, [(rec, write_id)])
        except Exception as exc:  # noqa: BLE001 - what it raised is the finding
            raised[i] = exc
        done[i] = True

    with working(run.harness.healthy) as first, working(run.harness.healthy) as second:
        threads = [threading.Thread(target=call, args=(i, adapter), daemon=True,
                                    name=f"conformance-concurrent-{i}")
                   for i, adapter in enumerate((first, second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CALL_TIMEOUT)
    if not all(done):
        run.check(CONCURRENT, False, f"a call did not return within {CALL_TIMEOUT:.0f} s")
        return
    found = run.read_other([(rec, write_id)])
    both_refused = all(isinstance(exc, BeforeWriteError) for exc in raised)
    answers = "; ".join(f"call {i + 1} {raised_words(exc)}" for i, exc in enumerate(raised))
    if found is None and both_refused:
        run.check(CONCURRENT, False, f"the target holds the row, yet both calls said "
                  f"nothing was sent ({answers})")
        return
    run.check(CONCURRENT, found is None, f"the readback: {found} ({answers})")
