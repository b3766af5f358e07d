"""The kit's checks under each condition a harness can provoke (an unreachable target, a
quota, a refusal, a 500, an answer lost after the target applied the request)."""

from __future__ import annotations

from collections.abc import Sequence

from runner.conformance.base import Condition, Run, absent_id, attempt, items, opened, write
from runner.leads.models import CRMRecord
from runner.leads.port import BeforeWriteError, CRMAdapter, Missing, RateLimited


def condition(run: Run, condition: Condition) -> None:
    source = run.harness.conditions.get(condition)
    name = f"{condition}: write"
    if source is None:
        run.skip(name, "condition not provided")
        return
    written = items(2)
    with opened(source) as adapter:
        raised = attempt(lambda: write(adapter, written))
        what = "returned normally" if raised is None else f"raised {type(raised).__name__}"
        before = isinstance(raised, BeforeWriteError)
        if condition is Condition.UNREACHABLE:
            run.check(name, before, f"{what}; expected BeforeWriteError (nothing sent)")
            run.guarded(f"{condition}: read back", lambda: _read_fails(run, adapter))
        elif condition is Condition.RATE_LIMITED:
            run.check(name, isinstance(raised, RateLimited), f"{what}; expected RateLimited")
        elif condition is Condition.REJECTED:
            run.check(name, before, f"{what}; expected BeforeWriteError "
                                    "(RejectedWrite recommended)")
        else:
            run.check(name, raised is not None and not before,
                      f"{what}; expected an error that is not BeforeWriteError (the "
                      "target may have applied the request)")
            if condition is not Condition.SERVER_ERROR:
                run.guarded(f"{condition}: read back",
                            lambda: _applied(run, condition, written))


def _read_fails(run: Run, adapter: CRMAdapter) -> None:
    try:
        rows = adapter.read_back(absent_id())
    except Exception:  # noqa: BLE001 - a failed read must raise: that is the check
        run.check("unreachable: read back", True)
    else:
        run.check("unreachable: read back", False,
                  f"read_back answered {len(list(rows))} rows from an unreachable "
                  "target; it must raise (\"no rows\" would allow a resend)")
    try:
        seen = adapter.observe_status(["conformance-x"])
    except Exception:  # noqa: BLE001 - raising is a failed read, as it should be
        seen = {}
    run.check("unreachable: status", not isinstance(seen.get("conformance-x"), Missing),
              "observe_status said Missing for an unreachable target")


def _applied(run: Run, condition: Condition,
             written: Sequence[tuple[CRMRecord, str]]) -> None:
    """Read back through a healthy adapter: the rows the target applied are there, each
    exactly once (so runner's reconcile confirms them)."""
    found = run.read_other(written)
    run.check(f"{condition}: read back", found is None,
              f"after the lost answer, the readback: {found} (expected exactly one "
              "matching row per record)")
