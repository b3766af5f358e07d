"""The conformance kit for target adapters (issue 17): run it against your own adapter
before runner delivers through it.

runner's never-twice guarantee rests on two promises an adapter makes
(docs/how-to/target-adapter.md): it raises ``BeforeWriteError`` *only* when the request
certainly did not leave, and ``read_back`` reports exactly the rows the target holds.  A
wrong ``BeforeWriteError`` is a duplicate row waiting to happen; a ``read_back`` that
answers "none" when it could not read is a resend of something already there.  The kit
drives an adapter through every outcome class and checks both promises::

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

``healthy`` and every condition are factories of context managers that yield an adapter
(a plain adapter works too: it is used as is, and closed with ``close()`` if it has one).
Every ``healthy()`` adapter must reach the *same* target (the kit reads a row back through
a second adapter, so a cache of what was written cannot pass).  A condition you cannot
provoke is left out: its checks are reported as skipped, never as passed.

The conditions, and what the adapter must do under each (a write is ``write_batch`` when
the adapter has it, else ``write``):

========================  ==========================================================
``UNREACHABLE``           nothing can be sent (connection refused, no such host): the
                          write raises ``BeforeWriteError``; a readback *raises* (never
                          answers "no rows"); a status read never says ``Missing``
``RATE_LIMITED``          the target refuses for its quota: ``RateLimited``
``REJECTED``              the target refuses the request as invalid: a
                          ``BeforeWriteError`` (``RejectedWrite`` recommended)
``SERVER_ERROR``          the target fails in a way the client cannot tell from a failure
                          after applying (a 500): anything but ``BeforeWriteError``
``APPLIED_THEN_LOST``     the target applies, then the answer is lost (a dropped
                          connection): anything but ``BeforeWriteError``, and the
                          readback then finds exactly one matching row per record
``TIMEOUT_AFTER_APPLY``   the target applies, then answers after the client's timeout:
                          as ``APPLIED_THEN_LOST``
========================  ==========================================================

The records the kit writes are synthetic, with fresh ``write_id`` values, so it can run
against a test target that already holds rows; it never deletes anything.
"""

from __future__ import annotations

import contextlib
import enum
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from runner.leads.models import CRMRecord
from runner.leads.port import (
    BeforeWriteError,
    CRMAdapter,
    Missing,
    RateLimited,
    Snapshot,
    classify_readback,
    max_batch,
)

__all__ = ["Check", "Condition", "Harness", "Report", "check_adapter"]


class Condition(enum.StrEnum):
    UNREACHABLE = "unreachable"
    RATE_LIMITED = "rate_limited"
    REJECTED = "rejected"
    SERVER_ERROR = "server_error"
    APPLIED_THEN_LOST = "applied_then_lost"
    TIMEOUT_AFTER_APPLY = "timeout_after_apply"


AdapterSource = Callable[[], "AbstractContextManager[Any] | Any"]


@dataclass
class Harness:
    """How the kit reaches your target: healthy, and under each condition you can provoke."""

    healthy: AdapterSource
    conditions: Mapping[Condition, AdapterSource] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Literal["passed", "failed", "skipped"]
    detail: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "failed"]

    @property
    def skipped(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "skipped"]

    def text(self) -> str:
        return "\n".join(f"{c.outcome:7} {c.name}" + (f": {c.detail}" if c.detail else "")
                         for c in self.checks)

    def assert_passed(self, *, require: Sequence[Condition] = ()) -> None:
        """Raise AssertionError if any check failed, or a required condition was skipped."""
        missing = [str(c) for c in require if any(
            s.name.startswith(f"{c}:") for s in self.skipped)]
        if self.failures or missing:
            lines = [f"{c.name}: {c.detail}" for c in self.failures]
            lines += [f"{name}: required but not provided" for name in missing]
            raise AssertionError("the adapter does not conform:\n" + "\n".join(lines))


def _record(tag: str, *, alias: str | None = "alias", is_test: bool = True) -> CRMRecord:
    return CRMRecord(tenant="tenant-conformance", source="meta",
                     source_lead_id=f"conformance-{tag}", is_test=is_test,
                     contact_alias=None if alias is None else f"{alias}-{tag}")


def _items(n: int, **kw: Any) -> list[tuple[CRMRecord, str]]:
    out = []
    for _ in range(n):
        tag = uuid.uuid4().hex[:12]
        out.append((_record(tag, **kw), f"conformance-{tag}"))
    return out


@contextlib.contextmanager
def _opened(source: AdapterSource) -> Iterator[Any]:
    made = source()
    if isinstance(made, AbstractContextManager):
        with made as adapter:
            yield adapter
        return
    try:
        yield made
    finally:
        close = getattr(made, "close", None)
        if callable(close):
            close()


def _write(adapter: CRMAdapter, items: Sequence[tuple[CRMRecord, str]]) -> None:
    batch = getattr(adapter, "write_batch", None)
    if callable(batch) and getattr(adapter, "batches", True):
        batch(list(items))
    else:
        for record, write_id in items:
            adapter.write(record, write_id)


def _verdicts(adapter: CRMAdapter, items: Sequence[tuple[CRMRecord, str]]) -> list[str]:
    return [classify_readback(list(adapter.read_back(w)), r, w) for r, w in items]


class _Run:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.report = Report()

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.report.checks.append(Check(name, "passed" if ok else "failed",
                                        "" if ok else detail))

    def guarded(self, name: str, body: Callable[[], None]) -> None:
        """Run a group of checks; an unexpected exception fails the group."""
        try:
            body()
        except Exception as exc:  # noqa: BLE001 - any failure of the adapter is a finding
            self.check(name, False, f"raised {type(exc).__name__}: {exc}")

    # -- healthy ------------------------------------------------------------------------

    def healthy(self) -> None:
        with _opened(self.harness.healthy) as adapter:
            self.guarded("healthy: write then read back", lambda: self._roundtrip(adapter))
            self.guarded("healthy: exact fields", lambda: self._exact(adapter))
            self.guarded("healthy: unknown write_id", lambda: self._unknown(adapter))
            self.guarded("healthy: batch", lambda: self._batch(adapter))
            self.guarded("healthy: status", lambda: self._status(adapter))
            self.guarded("healthy: identity", lambda: self._identity(adapter))

    def _roundtrip(self, adapter: CRMAdapter) -> None:
        items = _items(1)
        adapter.write(*items[0])
        self.check("healthy: write then read back", _verdicts(adapter, items) == ["match"],
                   f"readback verdict {_verdicts(adapter, items)}, expected match")
        with _opened(self.harness.healthy) as other:
            self.check("healthy: read back by another adapter (not a cache)",
                       _verdicts(other, items) == ["match"],
                       "a second healthy() adapter does not find the row")

    def _exact(self, adapter: CRMAdapter) -> None:
        items = _items(1, alias=None, is_test=False)
        adapter.write(*items[0])
        found = _verdicts(adapter, items)
        self.check("healthy: exact fields", found == ["match"],
                   f"a record with contact_alias None and is_test False read back as "
                   f"{found} (fields must come back with their types)")

    def _unknown(self, adapter: CRMAdapter) -> None:
        rows = list(adapter.read_back(f"conformance-absent-{uuid.uuid4().hex}"))
        self.check("healthy: unknown write_id", rows == [],
                   f"read_back of a write_id never written returned {len(rows)} rows")

    def _batch(self, adapter: CRMAdapter) -> None:
        batch = getattr(adapter, "write_batch", None)
        if not callable(batch):
            self.report.checks.append(Check("healthy: batch", "skipped",
                                            "no write_batch: sent one record per request"))
            return
        limit = max_batch(adapter)  # a bad max_batch fails the group
        items = _items(min(3, limit or 3))
        batch(items)
        self.check("healthy: batch", _verdicts(adapter, items) == ["match"] * len(items),
                   f"batch rows read back as {_verdicts(adapter, items)}")
        many = getattr(adapter, "read_back_many", None)
        if callable(many):
            absent = f"conformance-absent-{uuid.uuid4().hex}"
            rows = list(many([w for _, w in items] + [absent]))
            ids = sorted(r.write_id for r in rows)
            self.check("healthy: read_back_many", ids == sorted(w for _, w in items),
                       f"read_back_many returned write_ids {ids}")

    def _status(self, adapter: CRMAdapter) -> None:
        items = _items(1)
        adapter.write(*items[0])
        absent = f"conformance-absent-{uuid.uuid4().hex}"
        seen = adapter.observe_status([items[0][1], absent])
        self.check("healthy: status of a row", isinstance(seen.get(items[0][1]), Snapshot),
                   f"observe_status of a written row gave {seen.get(items[0][1])!r}")
        self.check("healthy: status of no row", isinstance(seen.get(absent), Missing),
                   f"observe_status of a write_id never written gave {seen.get(absent)!r} "
                   "(expected Missing: the target says it has no such row)")

    def _identity(self, adapter: CRMAdapter) -> None:
        target_id = getattr(adapter, "target_id", None)
        if not callable(target_id):
            self.report.checks.append(Check("healthy: identity", "skipped",
                                            "no target_id: the target cannot be pinned"))
            return
        first = target_id()
        adapter.write(*_items(1)[0])
        with _opened(self.harness.healthy) as other:
            again = getattr(other, "target_id", lambda: None)()
        self.check("healthy: identity", first is not None and first == target_id() == again,
                   f"target_id is not stable ({first!r}, then {again!r})")

    # -- conditions ---------------------------------------------------------------------

    def condition(self, condition: Condition) -> None:
        source = self.harness.conditions.get(condition)
        name = f"{condition}: write"
        if source is None:
            self.report.checks.append(Check(name, "skipped", "condition not provided"))
            return
        items = _items(2)
        with _opened(source) as adapter:
            try:
                _write(adapter, items)
                raised: Exception | None = None
            except Exception as exc:  # noqa: BLE001 - what it raised is the finding
                raised = exc
            what = "returned normally" if raised is None else f"raised {type(raised).__name__}"
            before = isinstance(raised, BeforeWriteError)
            if condition is Condition.UNREACHABLE:
                self.check(name, before, f"{what}; expected BeforeWriteError (nothing sent)")
                self.guarded(f"{condition}: read back", lambda: self._read_fails(adapter))
            elif condition is Condition.RATE_LIMITED:
                self.check(name, isinstance(raised, RateLimited),
                           f"{what}; expected RateLimited")
            elif condition is Condition.REJECTED:
                self.check(name, before, f"{what}; expected BeforeWriteError "
                                         "(RejectedWrite recommended)")
            else:
                self.check(name, raised is not None and not before,
                           f"{what}; expected an error that is not BeforeWriteError (the "
                           "target may have applied the request)")
                if condition is not Condition.SERVER_ERROR:
                    self.guarded(f"{condition}: read back",
                                 lambda: self._applied(condition, items))

    def _read_fails(self, adapter: CRMAdapter) -> None:
        try:
            rows = adapter.read_back(f"conformance-absent-{uuid.uuid4().hex}")
        except Exception:  # noqa: BLE001 - a failed read must raise: that is the check
            self.check("unreachable: read back", True)
        else:
            self.check("unreachable: read back", False,
                       f"read_back answered {len(list(rows))} rows from an unreachable "
                       "target; it must raise (\"no rows\" would allow a resend)")
        try:
            seen = adapter.observe_status(["conformance-x"])
        except Exception:  # noqa: BLE001 - raising is a failed read, as it should be
            seen = {}
        self.check("unreachable: status", not isinstance(seen.get("conformance-x"), Missing),
                   "observe_status said Missing for an unreachable target")

    def _applied(self, condition: Condition,
                 items: Sequence[tuple[CRMRecord, str]]) -> None:
        """Read back through a healthy adapter: the rows the target applied are there,
        each exactly once (so runner's reconcile confirms them)."""
        with _opened(self.harness.healthy) as healthy:
            found = _verdicts(healthy, items)
        self.check(f"{condition}: read back", found == ["match"] * 2,
                   f"after the lost answer, readback verdicts {found}, expected exactly "
                   "one matching row per record")


def check_adapter(harness: Harness) -> Report:
    """Drive the adapter through the healthy path and every condition; the report lists
    every check as passed, failed or skipped."""
    run = _Run(harness)
    run.healthy()
    for condition in Condition:
        run.condition(condition)
    return run.report
