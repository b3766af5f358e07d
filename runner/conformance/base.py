"""What every part of the kit shares: the harness, the report, synthetic records, and how
a readback is judged and said in words."""

from __future__ import annotations

import contextlib
import enum
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from runner.leads.intake import new_write_ids
from runner.leads.models import CRMRecord
from runner.leads.port import CRMAdapter, TargetRow, classify_readback
from runner.limits import DEFAULT_BATCH_SIZE, POLL_LIMIT_RANGE


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
    """How the kit reaches your target: healthy, and under each condition you can provoke;
    and the sizes you run runner at, so the kit checks your adapter at them."""

    healthy: AdapterSource
    conditions: Mapping[Condition, AdapterSource] = field(default_factory=dict)
    #: the ``--batch-size`` you run runner with (runner's default: 1,000): the kit writes
    #: one batch of this many records (at most the adapter's ``max_batch``, as runner
    #: does) and reads as many back in one ``read_back_many`` (at most its ``max_read``)
    batch_size: int = DEFAULT_BATCH_SIZE
    #: the largest ``--poll-limit`` you run runner with (by default the largest runner
    #: takes, 1,000): the kit reads that many statuses in one ``observe_status`` (at most
    #: the adapter's ``max_read``)
    poll_limit: int = POLL_LIMIT_RANGE[1]

    def __post_init__(self) -> None:
        for name in ("batch_size", "poll_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Harness.{name} must be a positive whole number, "
                                 f"not {value!r}")


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Literal["passed", "failed", "skipped"]
    detail: str = ""


#: what the kit found of the adapter's ``dedupes_write_id`` (see :class:`Report`)
Dedupe = Literal["proven", "not_declared", "not_proven"]

DEDUPE_WORDS: Mapping[Dedupe, str] = {
    "proven": "proven: runner may send again an uncertain record whose fresh readback "
              "shows no row",
    "not_declared": "not declared: runner will not resend uncertain records for this "
                    "adapter (a readback or an operator decides them)",
    "not_proven": "NOT proven: do not declare dedupes_write_id until the kit proves it "
                  "(runner would resend on the adapter's word)",
}


#: what the kit found of the adapter's ``marks_batches`` (see :class:`Report`)
Marks = Literal["proven", "not_declared", "not_proven"]

MARKS_WORDS: Mapping[Marks, str] = {
    "proven": "proven: a store that forgot what it sent notices it at this target and "
              "reads before it sends",
    "not_declared": "not declared: a store that forgot what it sent (an emptied or "
                    "restored store, a promoted lagging standby) cannot notice it here",
    "not_proven": "NOT proven: do not declare marks_batches until the kit proves it "
                  "(runner would trust a fence the target may not keep)",
}


@dataclass
class Report:
    """Every check the kit ran, passed, failed or skipped; and whether the adapter's
    ``dedupes_write_id`` is proven (``dedupe_proven``), which is what lets runner resend
    an uncertain record (SPEC E7)."""

    checks: list[Check] = field(default_factory=list)
    #: ``proven``: declared, and every check of the dedupe proof passed; ``not_declared``:
    #: the adapter does not declare it; ``not_proven``: declared and some check failed,
    #: or the declaration is not a bool or could not be read
    dedupe: Dedupe = "not_declared"
    #: the same for ``marks_batches`` (``runner.conformance.marks``)
    marks: Marks = "not_declared"

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "failed"]

    @property
    def skipped(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "skipped"]

    @property
    def dedupe_proven(self) -> bool:
        """Whether the adapter may declare ``dedupes_write_id = True``: it does, and the
        kit proved it (one row for a write_id written twice in one batch, in two batches
        and in two concurrent calls, and a repeated write answered without stranding)."""
        return self.dedupe == "proven"

    @property
    def marks_proven(self) -> bool:
        """Whether the adapter may declare ``marks_batches = True``: it does, and the kit
        proved it (a stale or foreign batch applies nothing and says so, ``raise_mark``
        fences and transfers, ``read_by_keys`` finds rows under any write_id, concurrent
        marked batches leave one consistent mark and no partial batch)."""
        return self.marks == "proven"

    def text(self) -> str:
        lines = [f"{c.outcome:7} {c.name}" + (f": {c.detail}" if c.detail else "")
                 for c in self.checks]
        return "\n".join([*lines, f"marks_batches {MARKS_WORDS[self.marks]}",
                          f"dedupes_write_id {DEDUPE_WORDS[self.dedupe]}"])

    def assert_passed(self, *, require: Sequence[Condition] = (),
                      require_dedupe: bool = False, require_marks: bool = False) -> None:
        """Raise AssertionError if any check failed, a required condition was skipped, or
        (``require_dedupe``, ``require_marks``) the adapter's deduplication or its marks
        are not proven."""
        missing = [str(c) for c in require if any(
            s.name.startswith(f"{c}:") for s in self.skipped)]
        lines = [f"{c.name}: {c.detail}" for c in self.failures]
        lines += [f"{name}: required but not provided" for name in missing]
        if require_dedupe and not self.dedupe_proven:
            lines.append(f"dedupes_write_id: required, but {DEDUPE_WORDS[self.dedupe]}")
        if require_marks and not self.marks_proven:
            lines.append(f"marks_batches: required, but {MARKS_WORDS[self.marks]}")
        if lines:
            raise AssertionError("the adapter does not conform:\n" + "\n".join(lines))


def record(tag: str, *, alias: str | None = "alias", is_test: bool = True) -> CRMRecord:
    return CRMRecord(tenant="tenant-conformance", source="meta",
                     source_lead_id=f"conformance-{tag}", is_test=is_test,
                     contact_alias=None if alias is None else f"{alias}-{tag}")


def items(n: int, **kw: Any) -> list[tuple[CRMRecord, str]]:
    """``n`` synthetic records with fresh write_ids made as runner makes them (the same
    form and length: a URL or a query full of them is as long as runner's), never reused."""
    return [(record(uuid.uuid4().hex[:12], **kw), str(write_id))
            for write_id in new_write_ids(n)]


def absent_id() -> str:
    """A write_id no record was ever written with."""
    return str(new_write_ids(1)[0])


@contextlib.contextmanager
def opened(source: AdapterSource) -> Iterator[Any]:
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


def before_work(adapter: object) -> None:
    """What runner does with an adapter before its first write (the checks before work,
    ``runner.tasks.target``): ``prepare_writes(create=True)`` and ``target_id()``, each
    if the adapter has it.  An adapter may learn from its target what it declares (a
    server says in its identity that it deduplicates), so the kit asks as runner does."""
    prepare = getattr(adapter, "prepare_writes", None)
    if callable(prepare):
        prepare(True)
    target_id = getattr(adapter, "target_id", None)
    if callable(target_id):
        target_id()


@contextlib.contextmanager
def working(source: AdapterSource) -> Iterator[Any]:
    """An adapter of ``source``, opened and through the checks before work."""
    with opened(source) as adapter:
        before_work(adapter)
        yield adapter


def batches(adapter: object) -> bool:
    """Whether runner sends this adapter many records in one request (as
    ``CRMRecordPort.batches``)."""
    return (callable(getattr(adapter, "write_batch", None))
            and bool(getattr(adapter, "batches", True)))


def reads_many(adapter: object) -> bool:
    return callable(getattr(adapter, "read_back_many", None))


def write(adapter: CRMAdapter, records: Sequence[tuple[CRMRecord, str]]) -> None:
    """One request for the records if the adapter batches, else one ``write`` each."""
    if batches(adapter):
        adapter.write_batch(list(records))  # type: ignore[attr-defined]
    else:
        for rec, write_id in records:
            adapter.write(rec, write_id)


def attempt(call: Callable[[], object]) -> Exception | None:
    """What ``call`` raised (None: it returned)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - what an adapter raises is the finding
        return exc
    return None


def raised_words(exc: BaseException | None) -> str:
    return "returned normally" if exc is None else f"raised {type(exc).__name__}: {exc}"


def differences(fields: Mapping[str, Any], expected: CRMRecord) -> list[str]:
    """How a row's fields differ from the record, field by field, types included (values
    are not shown: they may be contact fields)."""
    want = expected.fields()
    found: list[str] = []
    for name, value in want.items():
        if name not in fields:
            found.append(f"{name} is missing")
        elif fields[name].__class__ is not value.__class__:
            found.append(f"{name} came back as {type(fields[name]).__name__}, expected "
                         f"{type(value).__name__}")
        elif fields[name] != value:
            found.append(f"{name} differs")
    extra = sorted(str(name) for name in fields if name not in want)
    if extra:
        found.append(f"fields the record does not have: {', '.join(extra)}")
    return found


def grouped(rows: Sequence[TargetRow]) -> dict[str, list[TargetRow]]:
    by_id: dict[str, list[TargetRow]] = {}
    for row in rows:
        by_id.setdefault(row.write_id, []).append(row)
    return by_id


def judged(by_id: Mapping[str, Sequence[TargetRow]],
           records: Sequence[tuple[CRMRecord, str]]) -> str | None:
    """None when every record reads back as exactly one row equal to it, types included;
    else what was found, in words."""
    counts = {"none": 0, "ambiguous": 0, "mismatch": 0}
    first_difference: list[str] = []
    most = 0
    for rec, write_id in records:
        rows = [row for row in by_id.get(write_id, ()) if row.write_id == write_id]
        verdict = classify_readback(rows, rec, write_id)
        if verdict == "match":
            continue
        counts[verdict] += 1
        most = max(most, len(rows))
        if verdict == "mismatch" and not first_difference:
            first_difference = differences(rows[0].fields, rec) or ["the row differs"]
    if not any(counts.values()):
        return None
    if len(records) == 1:
        return ("no row" if counts["none"] else f"{most} rows" if counts["ambiguous"]
                else f"one row, but {'; '.join(first_difference)}")
    n = len(records)
    parts = []
    if counts["none"]:
        parts.append(f"{counts['none']} of {n} have no row")
    if counts["ambiguous"]:
        parts.append(f"{counts['ambiguous']} of {n} have two or more rows")
    if counts["mismatch"]:
        parts.append(f"{counts['mismatch']} of {n} differ ({'; '.join(first_difference)})")
    return ", ".join(parts)


class Run:
    """One run of the kit: the harness and the report its checks fill."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.report = Report()

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.report.checks.append(Check(name, "passed" if ok else "failed",
                                        "" if ok else detail))

    def skip(self, name: str, detail: str) -> None:
        self.report.checks.append(Check(name, "skipped", detail))

    def guarded(self, name: str, body: Callable[[], None]) -> None:
        """Run a group of checks; an unexpected exception fails the group."""
        try:
            body()
        except Exception as exc:  # noqa: BLE001 - any failure of the adapter is a finding
            self.check(name, False, f"raised {type(exc).__name__}: {exc}")

    def read_other(self, records: Sequence[tuple[CRMRecord, str]]) -> str | None:
        """Judge the records' rows as read through a new ``healthy()`` adapter (so a cache
        of what was written cannot pass), one ``read_back`` each."""
        with opened(self.harness.healthy) as reader:
            return judged({w: list(reader.read_back(w)) for _, w in records}, records)
