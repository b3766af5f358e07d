"""The marks proof (SPEC E8, issue 30): an adapter that declares ``marks_batches = True``
lets a store that forgot what it sent (a promoted lagging standby, a restored backup)
notice it at the target and read before it sends (:mod:`runner.leads.marks`).  That is
safe only if the target checks each mark and applies it *with* its rows, atomically, and
refuses applying nothing.  The kit proves each part on the real target, in this order
(each check needs the ones before it; after a failure the rest are not reached):

``marks: a marked batch applies and is held``
    a batch of a new store's mark applies, and ``read_mark`` (through another adapter)
    holds that store and seq.  A target another store owns already (a test target the kit
    ran against before) is adopted first, with ``raise_mark(…, replaces=owner)``.
``marks: a stale seq applies nothing``
    a batch whose seq equals the held one, one whose seq is lower, and one of a newer
    epoch whose fence was not raised (a request of a forgotten history that began an
    epoch of its own), each raise ``StaleMark`` carrying the held mark, and none of their
    rows is there.
``marks: another store's batch applies nothing``
    a batch (and a row-less ``raise_mark``) of another store, with a higher seq, raise
    ``ForeignMark`` carrying the held mark, applying nothing.
``marks: raise_mark with replaces transfers ownership``
    ``raise_mark(mark, replaces=owner)`` makes the target the new store's; then the old
    owner's batch is foreign and the new owner's applies.
``marks: a raised fence refuses an older seq``
    ``raise_mark`` to a new epoch answers the mark it replaced; after it, a batch of the
    old epoch (a request still on its way when the store noticed it was behind) is stale
    and applies nothing, and so is ``raise_mark`` to the seq held.
``marks: read_by_keys finds rows under another write_id``
    a record written twice under two write_ids is found by its (tenant, source_lead_id)
    as both rows, exactly; a key without rows finds none.
``marks: concurrent marked batches``
    after a fence, two adapters in two threads, released together, send batches of one
    store with two seqs of its epoch, several times: the newer always applies, the older
    applies only if it came first (else ``StaleMark``); every batch is whole or absent,
    and the target holds the newer seq.

Every read is through a second ``healthy()`` adapter (opened once for the proof, so a
cache of what the writing adapter sent cannot pass) and exact (types included).  The
proof leaves the target owned by a store of the kit's: run it against a test target,
never one a store delivers to (that store would find its target owned by another store,
and stop).  An adapter that does not declare ``marks_batches`` has these checks skipped.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runner.conformance.base import (
    Run,
    attempt,
    before_work,
    grouped,
    items,
    judged,
    opened,
    raised_words,
    reads_many,
    record,
    working,
)
from runner.errors import UsageError
from runner.leads.marks import (
    BatchMark,
    ForeignMark,
    StaleMark,
    TargetMark,
    epoch_of,
    in_words,
    marks,
    seq_of,
)
from runner.leads.models import CRMRecord

DECLARED = "marks: declared"
APPLIED = "marks: a marked batch applies and is held"
STALE = "marks: a stale seq applies nothing"
FOREIGN = "marks: another store's batch applies nothing"
TRANSFER = "marks: raise_mark with replaces transfers ownership"
FENCE = "marks: a raised fence refuses an older seq"
BY_KEYS = "marks: read_by_keys finds rows under another write_id"
CONCURRENT = "marks: concurrent marked batches"
PROOF = (APPLIED, STALE, FOREIGN, TRANSFER, FENCE, BY_KEYS, CONCURRENT)
NOT_DECLARED = ("does not declare marks_batches: a store that forgot what it sent cannot "
                "notice it at this target")
#: rounds of the concurrent check, records per batch in it, and how long a call may take
ROUNDS = 4
CONCURRENT_BATCH = 20
CALL_TIMEOUT = 60.0

Items = list[tuple[CRMRecord, str]]


def _mark_words(mark: TargetMark | None) -> str:
    if mark is None:
        return "none"
    owner = "no owner" if mark.owner is None else f"store {mark.owner[:20]}"
    return f"{owner} at {in_words(mark.seq)}"


class _Failed(Exception):
    """A check of the proof failed (already reported): the rest are not reached."""


@dataclass
class _Proof:
    """The state the proof's steps share: the adapter it writes through, the kit's two
    stores (``a`` then ``b``) and the epoch it started in."""

    run: Run
    adapter: Any
    reader: Any
    a: str
    b: str
    epoch: int = 0

    def seq(self, epochs: int, counter: int) -> int:
        return seq_of(self.epoch + epochs, counter)

    def held(self) -> TargetMark:
        """The mark as the reader reads it."""
        found = self.reader.read_mark()
        if not isinstance(found, TargetMark):
            raise AssertionError(f"read_mark returned {type(found).__name__}, not a "
                                 "TargetMark")
        return found

    def expect(self, name: str, ok: bool, detail: str) -> None:
        if not ok:
            self.run.check(name, False, detail)
            raise _Failed

    def write(self, batch: Items, store: str, seq: int) -> Exception | None:
        return attempt(lambda: self.adapter.write_batch(batch, mark=BatchMark(store, seq)))

    def refused(self, name: str, what: str, raised: Exception | None,
                kind: type[StaleMark | ForeignMark], held: TargetMark,
                batch: Items | None = None) -> None:
        """``raised`` is ``kind`` carrying ``held``, the batch's rows are not there, and
        the target's mark is still ``held``."""
        self.expect(name, isinstance(raised, kind),
                    f"{what} {raised_words(raised)}; expected {kind.__name__}")
        carried = getattr(raised, "held", None)
        self.expect(name, carried == held,
                    f"{what} raised {kind.__name__} carrying {_mark_words(carried)}; the "
                    f"target holds {_mark_words(held)}")
        if batch is not None:
            self.expect(name, self.absent(batch),
                        f"{what} was refused, yet rows of it are there: a refusal applies "
                        "nothing")
        now = self.held()
        self.expect(name, now == held, f"after {what}, the target holds {_mark_words(now)}, "
                                       f"not {_mark_words(held)}: a refusal changes nothing")


    def rows(self, batch: Sequence[tuple[CRMRecord, str]]) -> dict[str, list[Any]]:
        """The rows of the batch's write_ids, through the reader (one read_back_many
        where it has one)."""
        ids = [w for _, w in batch]
        if reads_many(self.reader):
            return grouped(list(self.reader.read_back_many(ids)))
        return {w: list(self.reader.read_back(w)) for w in ids}

    def absent(self, batch: Sequence[tuple[CRMRecord, str]]) -> bool:
        """Whether no record of ``batch`` has a row."""
        return not any(self.rows(batch).values())

    def read(self, batch: Sequence[tuple[CRMRecord, str]]) -> str | None:
        """The batch's rows judged (None: each record exactly once)."""
        return judged(self.rows(batch), batch)


def marks_proof(run: Run) -> None:
    with opened(run.harness.healthy) as adapter:
        try:
            before_work(adapter)  # what it declares may come from its target
            declared = marks(adapter)
        except Exception as exc:  # noqa: BLE001 - a bad declaration, or no target to ask
            why = exc.message if isinstance(exc, UsageError) else (
                f"the checks before work {raised_words(exc)}")
            run.check(DECLARED, False, why)
            for name in PROOF:
                run.skip(name, "not reached: the declaration could not be read")
            run.report.marks = "not_proven"
            return
        if not declared:
            for name in (DECLARED, *PROOF):
                run.skip(name, NOT_DECLARED)
            run.report.marks = "not_declared"
            return
        run.check(DECLARED, True)
        with working(run.harness.healthy) as reader:
            _prove(_Proof(run, adapter, reader, f"conformance-a-{uuid.uuid4().hex}",
                          f"conformance-b-{uuid.uuid4().hex}"))
    outcomes = {c.name: c.outcome for c in run.report.checks if c.name in PROOF}
    proven = all(outcomes.get(name) == "passed" for name in PROOF)
    run.report.marks = "proven" if proven else "not_proven"


def _prove(proof: _Proof) -> None:
    """Each step in order; after a failure, the rest are not reached."""
    run = proof.run
    steps: list[tuple[str, Callable[[_Proof], None]]] = [
        (APPLIED, _applied), (STALE, _stale), (FOREIGN, _foreign),
        (TRANSFER, _transfer), (FENCE, _fence), (BY_KEYS, _by_keys),
        (CONCURRENT, _concurrent)]
    for at, (name, step) in enumerate(steps):
        try:
            step(proof)
        except _Failed:
            pass
        except Exception as exc:  # noqa: BLE001 - any failure of the adapter is a finding
            run.check(name, False, f"raised {type(exc).__name__}: {exc}")
        else:
            run.check(name, True)
            continue
        for later, _ in steps[at + 1 :]:
            run.skip(later, f"not reached: {name!r} failed")
        break


def _applied(p: _Proof) -> None:
    start = p.held()
    p.epoch = epoch_of(start.seq) + 1
    if start.owner is not None:  # a test target the kit (or a store) used before
        p.adapter.raise_mark(BatchMark(p.a, p.seq(0, 0)), replaces=start.owner)
    batch = items(2)
    raised = p.write(batch, p.a, p.seq(0, 1))
    p.expect(APPLIED, raised is None, f"a batch of a new store's mark {raised_words(raised)}")
    found = p.read(batch)
    p.expect(APPLIED, found is None, f"after a marked batch, the readback: {found}")
    held = p.held()
    p.expect(APPLIED, held == TargetMark(p.a, p.seq(0, 1)),
             f"after a marked batch of {_mark_words(TargetMark(p.a, p.seq(0, 1)))}, "
             f"read_mark holds {_mark_words(held)}")


def _stale(p: _Proof) -> None:
    held = TargetMark(p.a, p.seq(0, 1))
    batch = items(2)
    p.refused(STALE, "a batch of the seq held", p.write(batch, p.a, p.seq(0, 1)),
              StaleMark, held, batch)
    batch = items(2)
    p.refused(STALE, "a batch of an older seq", p.write(batch, p.a, p.seq(0, 0)),
              StaleMark, held, batch)
    batch = items(2)
    p.refused(STALE, "a batch of a newer epoch whose fence was not raised",
              p.write(batch, p.a, p.seq(1, 1)), StaleMark, held, batch)


def _foreign(p: _Proof) -> None:
    held = TargetMark(p.a, p.seq(0, 1))
    batch = items(2)
    p.refused(FOREIGN, "a batch of another store", p.write(batch, p.b, p.seq(5, 0)),
              ForeignMark, held, batch)
    raised = attempt(lambda: p.adapter.raise_mark(BatchMark(p.b, p.seq(5, 0))))
    p.refused(FOREIGN, "raise_mark of another store (without replaces)", raised,
              ForeignMark, held)


def _transfer(p: _Proof) -> None:
    raised = attempt(lambda: p.adapter.raise_mark(BatchMark(p.b, p.seq(1, 0)),
                                                  replaces=p.a))
    p.expect(TRANSFER, raised is None,
             f"raise_mark replacing the owner {raised_words(raised)}")
    held = p.held()
    p.expect(TRANSFER, held == TargetMark(p.b, p.seq(1, 0)),
             f"after raise_mark replacing the owner, read_mark holds {_mark_words(held)}")
    batch = items(2)
    p.refused(TRANSFER, "a batch of the replaced owner", p.write(batch, p.a, p.seq(2, 0)),
              ForeignMark, held, batch)
    batch = items(2)
    raised = p.write(batch, p.b, p.seq(1, 1))
    p.expect(TRANSFER, raised is None, f"a batch of the new owner {raised_words(raised)}")
    found = p.read(batch)
    p.expect(TRANSFER, found is None, f"the new owner's batch, read back: {found}")


def _fence(p: _Proof) -> None:
    replaced: list[Any] = []
    raised = attempt(lambda: replaced.append(
        p.adapter.raise_mark(BatchMark(p.b, p.seq(2, 0)))))
    p.expect(FENCE, raised is None, f"raise_mark to a new epoch {raised_words(raised)}")
    before = TargetMark(p.b, p.seq(1, 1))
    p.expect(FENCE, replaced == [before],
             f"raise_mark to a new epoch answered {replaced[0] if replaced else None!r}, "
             f"not the mark it replaced ({_mark_words(before)})")
    held = p.held()
    p.expect(FENCE, held == TargetMark(p.b, p.seq(2, 0)),
             f"after raise_mark to a new epoch, read_mark holds {_mark_words(held)}")
    batch = items(2)
    p.refused(FENCE, "a batch of the epoch before the fence",
              p.write(batch, p.b, p.seq(1, 2)), StaleMark, held, batch)
    raised = attempt(lambda: p.adapter.raise_mark(BatchMark(p.b, p.seq(2, 0))))
    p.refused(FENCE, "raise_mark to the seq held", raised, StaleMark, held)


def _by_keys(p: _Proof) -> None:
    rec = record(uuid.uuid4().hex[:12])
    (_, first), (_, second) = items(2)
    for counter, write_id in ((1, first), (2, second)):
        raised = p.write([(rec, write_id)], p.b, p.seq(2, counter))
        p.expect(BY_KEYS, raised is None, f"a marked batch {raised_words(raised)}")
    nobody = record(uuid.uuid4().hex[:12])
    rows = list(p.reader.read_by_keys([(rec.tenant, rec.source_lead_id),
                                       (nobody.tenant, nobody.source_lead_id)]))
    ids = sorted(row.write_id for row in rows)
    p.expect(BY_KEYS, ids == sorted((first, second)),
             f"a record written under two write_ids, read by its key: {len(rows)} rows "
             f"({'their own write_ids' if set(ids) <= {first, second} else 'of other write_ids'}"
             f"); expected its two rows, and none for a key without rows")
    found = judged({row.write_id: [row] for row in rows}, [(rec, first), (rec, second)])
    p.expect(BY_KEYS, found is None, f"the rows read by key are not the record: {found}")


def _concurrent(p: _Proof) -> None:
    with working(p.run.harness.healthy) as one, working(p.run.harness.healthy) as two:
        for round_ in range(ROUNDS):
            _round(p, round_, (one, two))


def _round(p: _Proof, round_: int, adapters: tuple[Any, Any]) -> None:
    """One round of the concurrent check."""
    base = p.seq(3 + round_, 0)
    p.adapter.raise_mark(BatchMark(p.b, base))  # the round's epoch: batches follow a fence
    batches = [items(CONCURRENT_BATCH), items(CONCURRENT_BATCH)]
    seqs = (base + 1, base + 2)
    # the threads start in both orders (the barrier releases them together)
    order = (0, 1) if round_ % 2 == 0 else (1, 0)
    barrier = threading.Barrier(2, timeout=CALL_TIMEOUT)
    raised: list[Exception | None] = [None, None]
    done = [False, False]

    def call(i: int, adapter: Any) -> None:
        try:
            barrier.wait()
            adapter.write_batch(batches[i], mark=BatchMark(p.b, seqs[i]))
        except Exception as exc:  # noqa: BLE001 - what it raised is the finding
            raised[i] = exc
        done[i] = True

    threads = [threading.Thread(target=call, args=(i, adapters[i]), daemon=True,
                                name=f"conformance-marks-{i}") for i in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CALL_TIMEOUT)
    p.expect(CONCURRENT, all(done), f"a call did not return within {CALL_TIMEOUT:.0f} s")
    answers = "; ".join(f"the batch of seq {in_words(seqs[i])} {raised_words(raised[i])}"
                        for i in (0, 1))
    p.expect(CONCURRENT, raised[1] is None and (
        raised[0] is None or isinstance(raised[0], StaleMark)),
        f"two concurrent marked batches: {answers} (expected the newer applied, the "
        "older applied or StaleMark)")
    for i in (0, 1):
        found = p.read(batches[i])
        if raised[i] is None:
            p.expect(CONCURRENT, found is None,
                     f"the batch of seq {in_words(seqs[i])} applied, yet the readback: "
                     f"{found}")
        else:
            p.expect(CONCURRENT, p.absent(batches[i]),
                     f"the batch of seq {in_words(seqs[i])} was refused, yet rows of it "
                     "are there: a refusal applies nothing")
    held = p.held()
    p.expect(CONCURRENT, held == TargetMark(p.b, seqs[1]),
             f"after two concurrent marked batches ({answers}), the target holds "
             f"{_mark_words(held)}, not {_mark_words(TargetMark(p.b, seqs[1]))}")
