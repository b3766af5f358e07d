"""The conformance kit for target adapters (issues 17, 29): run it against your own adapter
before runner delivers through it.

runner's never-twice guarantee rests on two promises an adapter makes
(docs/how-to/target-adapter.md): it raises ``BeforeWriteError`` *only* when the request
certainly did not leave, and ``read_back`` reports exactly the rows the target holds.  A
wrong ``BeforeWriteError`` is a duplicate row waiting to happen; a ``read_back`` that
answers "none" when it could not read is a resend of something already there.  The kit
drives an adapter through every outcome class and checks both promises, at the sizes
runner sends, and proves the adapter's ``dedupes_write_id`` when it declares it::

    from runner.testing import Condition, Harness, check_adapter

    harness = Harness(
        healthy=lambda: my_adapter("https://crm.test/api"),       # a context manager
        conditions={
            Condition.UNREACHABLE: lambda: my_adapter("https://nothing.invalid/api"),
            Condition.APPLIED_THEN_LOST: lambda: my_adapter_behind_a_dropping_proxy(),
        },
    )
    report = check_adapter(harness)
    print(report.text())
    report.assert_passed()
    report.dedupe_proven        # True only if it declares dedupes_write_id and the kit proved it
    report.marks_proven         # the same for marks_batches (issue 30)

``healthy`` and every condition are factories of context managers that yield an adapter
(a plain adapter works too: it is used as is, and closed with ``close()`` if it has one).
A healthy adapter is put through runner's checks before work (``prepare_writes(True)``,
``target_id()``, where it has them) before the kit writes through it or reads its
declarations.
Every ``healthy()`` adapter must reach the *same* target (the kit reads a row back through
a second adapter, so a cache of what was written cannot pass).  A condition you cannot
provoke is left out: its checks are reported as skipped, never as passed.

**Sizes.**  runner sends a batch of ``--batch-size`` records (1,000 by default; at most
the adapter's ``max_batch``) in one ``write_batch``, reads as many back in one
``read_back_many`` (at most its ``max_read``), and reads up to ``--poll-limit`` statuses
(up to 1,000) in one ``observe_status`` (at most ``max_read``).  The kit does the same,
at ``Harness.batch_size`` and ``Harness.poll_limit`` (runner's default batch and its
largest poll limit unless you say otherwise): an adapter that puts every write_id of a
read in one URL, or reads only the first page of an answer, fails here, not under runner.

**Exact.**  A row matches only with exactly the record's fields, each of the record's
type (``1`` is not ``True``): the rule runner confirms by (``classify_readback``).

The conditions, and what the adapter must do under each (a write is ``write_batch`` when
the adapter has it, else ``write``):

========================  ==========================================================
``UNREACHABLE``           nothing can be sent (connection refused, no such host): the
                          write raises ``BeforeWriteError``; a readback *raises* (never
                          answers "no rows"); a status read never says ``Missing``
``RATE_LIMITED``          the target refuses for its quota: ``RateLimited``
``REJECTED``              the target refuses the request as invalid, and its own
                          documentation promises nothing was applied: a
                          ``BeforeWriteError`` (``RejectedWrite`` recommended)
``SERVER_ERROR``          the target fails in a way the client cannot tell from a failure
                          after applying (a 500): anything but ``BeforeWriteError``
``APPLIED_THEN_LOST``     the target applies, then the answer is lost (a dropped
                          connection): anything but ``BeforeWriteError``, and the
                          readback then finds exactly one matching row per record
``TIMEOUT_AFTER_APPLY``   the target applies, then answers after the client's timeout:
                          as ``APPLIED_THEN_LOST``
========================  ==========================================================

The dedupe proof is described in ``runner.conformance.dedupe``: one row for a write_id
written twice in one batch, in two batches and in two concurrent calls, and a repeated
write whose answer does not strand the record.

The rows a write returns (an adapter may return its target's answer, and runner then
sends no readback) are checked as described in ``runner.conformance.answer``: they cover
the request and equal a readback, and for a write_id the target holds they show the row
as held, not as sent.

The marks proof is described in ``runner.conformance.marks``: a stale or foreign marked
batch applies nothing and raises ``StaleMark`` or ``ForeignMark``, ``raise_mark`` fences
and transfers ownership, ``read_by_keys`` finds rows under another write_id, and
concurrent marked batches leave one consistent mark and no partial batch.  It leaves the
target owned by a store of the kit's: run it against a test target.

The records the kit writes are synthetic, with fresh ``write_id`` values, so it can run
against a test target that already holds rows; it never deletes anything (a run at the
default sizes writes a little over 1,000 rows).
"""

from __future__ import annotations

from runner.conformance.answer import answer
from runner.conformance.base import Check, Condition, Harness, Report, Run
from runner.conformance.conditions import condition
from runner.conformance.dedupe import dedupe
from runner.conformance.healthy import healthy
from runner.conformance.marks import marks_proof

__all__ = ["Check", "Condition", "Harness", "Report", "check_adapter"]


def check_adapter(harness: Harness) -> Report:
    """Drive the adapter through the healthy path at runner's sizes, the dedupe proof (when
    it declares ``dedupes_write_id``), the marks proof (when it declares
    ``marks_batches``) and every condition; the report lists every check as passed,
    failed or skipped, and says whether deduplication and marks are proven
    (``Report.dedupe_proven``, ``Report.marks_proven``)."""
    run = Run(harness)
    healthy(run)
    dedupe(run)
    answer(run)
    marks_proof(run)
    for each in Condition:
        condition(run, each)
    return run.report
