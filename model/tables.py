"""The tables of ``model/check.py``: the model's properties and the guarantee each
checks, the bounds of each run, and the mutations (each a ``-D`` macro of
``model/delivery.pml`` that must break the property it names).  ``check.py`` imports
them; docs/hooks.py and tests/test_spin_model.py read them through it."""

from __future__ import annotations

from dataclasses import dataclass

SAFETY = (
    "no_duplicate_write",
    "confirmed_by_readback",
    "uncertain_never_resent",
    "acknowledged_never_lost",
    "no_dispatch_during_reconcile",
)
LIVENESS = ("every_record_settles", "every_record_confirmed")
PROPERTIES = SAFETY + LIVENESS
#: the properties that hold only for a target that deduplicates by write_id (``DEDUPE=1``)
DEDUPE_ONLY = ("every_record_confirmed",)

#: the guarantee each property checks, in words (the docs page renders these)
GUARANTEES: dict[str, str] = {
    "no_duplicate_write": "never two target rows for one `write_id`",
    "confirmed_by_readback": "a record is confirmed only after an exact readback of its own "
                             "row (while the target holds exactly that row)",
    "uncertain_never_resent": "an uncertain record is never sent again by runner (only an "
                              "operator's `not-sent` after a fresh readback releases it, "
                              "or, on a deduplicating target only, a reconcile readback "
                              "that shows no row)",
    "acknowledged_never_lost": "every acknowledged record is always in the store",
    "no_dispatch_during_reconcile": "nothing is dispatched while a reconcile call of the "
                                    "cycle is in progress or still owed",
    "every_record_settles": "under weak fairness, with a target that eventually answers, "
                            "every record ends confirmed (also after failed-safe) or "
                            "uncertain and visible: none stays in flight or prepared",
    "every_record_confirmed": "a target that deduplicates by `write_id` only: under weak "
                              "fairness, with a target that answers and reads at last, "
                              "every record ends confirmed with no operator command, "
                              "unless the target stored a row that differs from it (that "
                              "one stays uncertain, for the operator)",
}


@dataclass(frozen=True)
class Config:
    """A set of bounds for the model (its ``-D`` macros)."""

    name: str
    what: str
    defines: dict[str, int]


def _bounds(**overrides: int) -> dict[str, int]:
    base = {"N": 3, "BATCH": 1, "WORKERS": 2, "MAXCRASH": 2, "MAXFAULT": 1,
            "MAXRESOLVE": 1, "NETCAP": 2, "DEDUPE": 0, "TARGET_RECOVERS": 0, "REWIND": 0,
            "MAXFORGET": 0, "PIPELINE": 0, "SPLIT": 0}
    return {**base, **overrides}


CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("today", "the code on main: one record per target request", _bounds()),
    Config("batches", "the E1 design (issue 16): batches of 1 to 3 records per request",
           _bounds(BATCH=3)),
    Config("today-n2", "the code on main, 2 records (liveness: fairness multiplies states)",
           _bounds(N=2)),
    Config("batches-n2", "the E1 design, 2 records, batches of 1 or 2 (liveness)",
           _bounds(N=2, BATCH=2)),
    Config("batches-deep", "the E1 design, 3 records, batches of 1 to 3 (liveness, --deep)",
           _bounds(BATCH=3)),
    Config("small", "2 records, batches of 1 or 2 (--quick, the default pytest run)",
           _bounds(N=2, BATCH=2)),
    # E7 (issue 29): a target that deduplicates by write_id, and runner resends an
    # uncertain record whose readback shows no row.  Records now go round (uncertain,
    # failed-safe, in flight, ...), which multiplies the states: smaller bounds
    Config("dedupe", "a target that deduplicates by write_id (E7, issue 29): 2 records, "
           "batches of 1 or 2; failed reads and dropped requests unbounded",
           _bounds(N=2, BATCH=2, DEDUPE=1)),
    Config("dedupe-live", "a deduplicating target that answers and reads at last (failed "
           "reads and dropped requests count toward MAXFAULT), no operator, one request "
           "in transit (liveness)",
           _bounds(N=2, BATCH=2, DEDUPE=1, TARGET_RECOVERS=1, MAXRESOLVE=0, NETCAP=1)),
    Config("dedupe-deep", "a deduplicating target that answers and reads at last, 3 "
           "records, batches of 1 to 3, no operator, one request in transit (liveness, "
           "--deep)",
           _bounds(BATCH=3, DEDUPE=1, TARGET_RECOVERS=1, MAXRESOLVE=0, NETCAP=1)),
    Config("small-dedupe", "a deduplicating target that answers and reads at last: 2 "
           "records, batches of 1 or 2, one crash, no operator, one request in transit "
           "(--quick, the default pytest run)",
           _bounds(N=2, BATCH=2, MAXCRASH=1, DEDUPE=1, TARGET_RECOVERS=1, MAXRESOLVE=0,
                   NETCAP=1)),
    # E8 (issue 30): a target that marks batches, and a store that forgets once (REWIND=1,
    # MAXFORGET=1).  The seqs and the store's copy multiply the states (a hundredfold at
    # equal bounds): one worker (the forget and the crash start it again), one record per
    # request, no operator; a crash on top multiplies them by ten again, so CI checks the
    # main property alone with it
    Config("rewind", "a target that marks batches and a store that forgets once (E8, "
           "issue 30; REWIND=1, MAXFORGET=1): 2 records, one record per request, one "
           "worker, no crash but the forget's restart and a failed fence raise, no "
           "operator",
           _bounds(N=2, WORKERS=1, MAXCRASH=0, MAXRESOLVE=0, REWIND=1, MAXFORGET=1)),
    Config("rewind-crash", "the same, and one crash anywhere (a crash in a rewind "
           "included): never two rows only",
           _bounds(N=2, WORKERS=1, MAXCRASH=1, MAXRESOLVE=0, REWIND=1, MAXFORGET=1)),
    Config("small-rewind", "a target that marks batches and a store that forgets once, no "
           "crash but the forget's restart (--quick, the default pytest run)",
           _bounds(N=2, WORKERS=1, MAXCRASH=0, MAXRESOLVE=0, REWIND=1, MAXFORGET=1)),
    # issue 32: the pipelined dispatch (PIPELINE=1): the commit of the outcomes read back
    # last and the next batch's in-flight mark made while the batch before is at the
    # target, so two batches may be in flight at once
    Config("pipeline", "the pipelined dispatch (issue 32; PIPELINE=1): the next batch's "
           "in-flight mark committed beside the request of the batch before; 3 records, "
           "one record per request (three batches)", _bounds(PIPELINE=1)),
    Config("pipeline-batches", "the pipelined dispatch, batches of 1 to 3 records",
           _bounds(BATCH=3, PIPELINE=1)),
    Config("pipeline-n2", "the pipelined dispatch, 2 records, one per request (liveness)",
           _bounds(N=2, PIPELINE=1)),
    Config("pipeline-dedupe", "the pipelined dispatch to a target that deduplicates by "
           "write_id: 2 records, one per request",
           _bounds(N=2, DEDUPE=1, PIPELINE=1)),
    Config("pipeline-dedupe-live", "the pipelined dispatch to a deduplicating target that "
           "answers and reads at last, no operator, one request in transit (liveness)",
           _bounds(N=2, DEDUPE=1, TARGET_RECOVERS=1, MAXRESOLVE=0, NETCAP=1, PIPELINE=1)),
    Config("pipeline-rewind", "the pipelined dispatch to a target that marks batches, and a "
           "store that forgets once: 2 records, one per request, one worker, no crash but "
           "the forget's restart", _bounds(N=2, WORKERS=1, MAXCRASH=0, MAXRESOLVE=0,
                                            REWIND=1, MAXFORGET=1, PIPELINE=1)),
    Config("pipeline-rewind-crash", "the same, and one crash anywhere: never two rows only",
           _bounds(N=2, WORKERS=1, MAXCRASH=1, MAXRESOLVE=0, REWIND=1, MAXFORGET=1,
                   PIPELINE=1)),
    Config("small-pipeline", "the pipelined dispatch, 2 records, one per request (--quick, "
           "the default pytest run)", _bounds(N=2, MAXCRASH=1, PIPELINE=1)),
    # issue 32: the PostgreSQL store's step apart (SPLIT=1): a step's outcomes and the next
    # batch's in-flight mark are two transactions at once, committed in either order, a
    # crash possibly between them; serial and pipelined
    Config("split", "the step apart (issue 32; SPLIT=1): the last batch's outcomes and "
           "the next batch's in-flight mark in two transactions, either first; 3 records, "
           "batches of 1 to 3", _bounds(BATCH=3, SPLIT=1)),
    Config("split-n2", "the step apart, 2 records, batches of 1 or 2 (liveness)",
           _bounds(N=2, BATCH=2, SPLIT=1)),
    Config("pipeline-split", "the pipelined dispatch with the step apart: 3 records, one "
           "record per request", _bounds(PIPELINE=1, SPLIT=1)),
    Config("pipeline-split-n2", "the pipelined dispatch with the step apart, 2 records, "
           "one per request (liveness)", _bounds(N=2, PIPELINE=1, SPLIT=1)),
    Config("split-rewind", "the step apart to a target that marks batches, and a store "
           "that forgets once: 2 records, one per request, one worker, no crash but the "
           "forget's restart", _bounds(N=2, WORKERS=1, MAXCRASH=0, MAXRESOLVE=0, REWIND=1,
                                        MAXFORGET=1, SPLIT=1)),
    Config("pipeline-split-rewind-crash", "the pipelined dispatch with the step apart to a "
           "target that marks batches, a store that forgets once, and one crash anywhere: "
           "never two rows only",
           _bounds(N=2, WORKERS=1, MAXCRASH=1, MAXRESOLVE=0, REWIND=1, MAXFORGET=1,
                   PIPELINE=1, SPLIT=1)),
    Config("pipeline-split-dedupe-live", "the pipelined dispatch with the step apart to a "
           "deduplicating target that answers and reads at last, no operator, one request "
           "in transit (liveness)",
           _bounds(N=2, DEDUPE=1, TARGET_RECOVERS=1, MAXRESOLVE=0, NETCAP=1, PIPELINE=1,
                   SPLIT=1)),
)}


@dataclass(frozen=True)
class Mutation:
    """A one-line change to the model (a ``-D`` macro) and the property it must break."""

    macro: str
    breaks: str
    change: str
    #: "limit": not a bug in the model, a documented assumption; "finding": the code on
    #: main as it is, which the model shows wrong (the model checks the fix)
    kind: str = "mutation"
    dedupe: bool = False  # checked with a target that deduplicates by write_id (DEDUPE=1)
    rewind: bool = False  # checked with a target that marks and a store that forgets (REWIND=1)
    pipeline: bool = False  # checked on the pipelined dispatch (PIPELINE=1)


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("M_ACK_BEFORE_COMMIT", "acknowledged_never_lost",
             "accept answers the client before its commit"),
    Mutation("M_RETRY_IN_FLIGHT", "no_duplicate_write",
             "recovery makes an in-flight record failed-safe (resend on restart) instead "
             "of uncertain"),
    Mutation("M_LOST_ANSWER_IS_NOT_SENT", "no_duplicate_write",
             "a lost answer (timeout, dropped connection) counts as not sent"),
    Mutation("M_MARK_AFTER_SEND", "no_duplicate_write",
             "the in-flight mark commits after the request instead of before"),
    Mutation("M_NO_LOCK", "no_duplicate_write",
             "a worker starts without taking the worker lock"),
    Mutation("M_RESOLVE_WITHOUT_READBACK", "no_duplicate_write",
             "the operator's not-sent skips the fresh readback"),
    Mutation("M_CONFIRM_WITHOUT_READBACK", "confirmed_by_readback",
             "the target's answer confirms the batch without reading its rows back"),
    Mutation("M_EMPTY_READ_IS_NOT_SENT", "uncertain_never_resent",
             "a reconcile readback that finds no row makes the record sendable again"),
    Mutation("M_DISPATCH_UNCERTAIN", "uncertain_never_resent",
             "dispatch picks uncertain records too"),
    Mutation("M_DISPATCH_BEFORE_RECONCILE", "no_dispatch_during_reconcile",
             "the cycle dispatches before it reconciles"),
    Mutation("M_NO_RECOVER", "every_record_settles",
             "taking the lock does not make in-flight records uncertain"),
    Mutation("NO_ASSUMPTION_A1", "no_duplicate_write",
             "the operator resolves not-sent while a request of a dead worker may still "
             "reach the target (assumption A1 dropped)", kind="limit"),
    Mutation("M_RESEND_NONDEDUPE", "no_duplicate_write",
             "the deduplicating target's rule (a reconcile readback with no row authorises "
             "a resend) applied to a target that does not deduplicate"),
    Mutation("M_DEDUPE_NOT_ATOMIC", "no_duplicate_write",
             "the deduplicating target checks that it lacks a write_id, then inserts, in two "
             "steps: a resend between them is not seen", dedupe=True),
    Mutation("M_SEND_IN_RECONCILE", "no_dispatch_during_reconcile",
             "the reconcile pass of a deduplicating target sends a record with no row at "
             "once, instead of leaving it to the dispatch after the pass", dedupe=True),
    Mutation("M_RESEND_DIFFERING_ROW", "every_record_confirmed",
             "on a deduplicating target, a reconcile readback that shows a row that differs "
             "authorises a resend too: the record goes round for ever, resent and never "
             "left uncertain for the operator", dedupe=True),
    Mutation("M_NO_DEDUPE_RESEND", "every_record_confirmed",
             "runner ignores the target's deduplication: a reconcile readback with no row "
             "leaves the record uncertain, as for any target", dedupe=True),
    Mutation("M_NO_FENCE_AT_START", "no_duplicate_write",
             "a start begins no epoch and raises no fence unless the mark it reads is ahead "
             "of the store's (the first design; a StaleMark still rewinds): a forgotten "
             "request still in transit at the start lands after the store gave its seq "
             "again, with a higher counter of the same epoch", rewind=True),
    Mutation("M_FENCE_NO_REPLACED", "no_duplicate_write",
             "the start decides on the mark it read only, not on the mark the fence "
             "replaced: a forgotten batch that lands between the read and the fence is "
             "missed, and its record is sent again", rewind=True),
    Mutation("M_REWIND_WITHOUT_READBACK", "no_duplicate_write",
             "the rewind tags and fences but reads nothing back: each rewound record is "
             "sendable, and the records the forgotten history sent are sent again",
             rewind=True),
    Mutation("M_READ_BEFORE_FENCE", "no_duplicate_write",
             "the rewind reads back before it raises the fence: a request of the forgotten "
             "history lands between the readback (no row yet) and the fence", rewind=True),
    Mutation("M_NO_MARK_CHECK", "no_duplicate_write",
             "the target applies a fence or a batch whatever its mark (no StaleMark)",
             rewind=True),
    Mutation("M_SAME_EPOCH", "no_duplicate_write",
             "begin_epoch keeps the epoch and the fence jumps the counter past the target's "
             "seq: a forgotten request of that epoch with a higher counter, still in "
             "transit, applies later", rewind=True),
    Mutation("M_EPOCH_BEFORE_RAISE", "no_duplicate_write",
             "the fence's first order: the store commits its new epoch (and a rewind's "
             "tags) before the raise and records the fence in a last commit; a start that "
             "stops between them leaves the store's seq above a forgotten batch that lands "
             "meanwhile, and the next start, with no rewind pending, sees nothing (the "
             "delivery model's finding, fixed by begin_fenced_epoch)", rewind=True),
    Mutation("M_PIPELINE_MARK_WITH_OWN_SEND", "no_duplicate_write",
             "the pipelined dispatch overlaps a batch's in-flight mark with that batch's own "
             "request instead of the request of the batch before: the request may land "
             "before the mark commits", pipeline=True),
)


def mutation_config(m: Mutation, *, quick: bool = False) -> str:
    """The bounds a mutation is checked with: small ones for ``--quick`` and the pytest
    run; the liveness bounds for a mutation that breaks a liveness property."""
    if quick:
        if m.pipeline:
            return "small-pipeline"
        return "small-dedupe" if m.dedupe else "small-rewind" if m.rewind else "small"
    if m.pipeline:
        return "pipeline"
    if m.rewind:
        return "rewind-crash"
    if m.dedupe:
        return "dedupe-live" if m.breaks in LIVENESS else "dedupe"
    return "today-n2" if m.breaks in LIVENESS else "today"
