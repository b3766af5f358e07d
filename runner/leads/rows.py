"""What a target holds and what reading it proves (SPEC L5, L6, L9, L11): the rows of a
write_id, the status observations of a confirmed record, and the one rule that decides
what a readback proves (``classify_readback``: exactly one row, exactly the mapped record,
types included).  ``runner.leads.port`` re-exports every name here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord


@dataclass(frozen=True)
class TargetRow:
    """One row the target holds for a write_id: the record fields plus business columns."""

    write_id: str
    fields: Mapping[str, Any]
    status: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """A business observation of a confirmed record (``{"status": ...}`` for the sheet)."""

    data: Mapping[str, Any]
    kind: Literal["snapshot"] = "snapshot"


@dataclass(frozen=True)
class Missing:
    """The target explicitly says the row is gone."""

    kind: Literal["missing"] = "missing"


@dataclass(frozen=True)
class ReadFailure:
    """The status could not be read, or the read was ambiguous; never means deletion."""

    reason: str
    kind: Literal["failure"] = "failure"


Observation = Snapshot | Missing | ReadFailure


def observe_rows(statuses: Sequence[str]) -> Observation:
    """What a target's rows for one write_id say about its status: no row is an explicit
    ``Missing``, one row its status, more than one a failed (ambiguous) read."""
    if not statuses:
        return Missing()
    if len(statuses) > 1:
        return ReadFailure(f"ambiguous: {len(statuses)} rows")
    return Snapshot({"status": statuses[0]})


Readback = Literal["match", "none", "ambiguous", "mismatch"]


def classify_readback(rows: Sequence[TargetRow], expected: CRMRecord, write_id: str) -> Readback:
    """Decide what a readback proves (L5, L6).

    ``match``: exactly one row with this write_id whose record fields equal the mapped
    record (business columns such as ``status`` are ignored) — the write is done.
    ``none``: no row.  ``ambiguous``: two or more rows.  ``mismatch``: one row whose
    fields differ.  Only ``match`` confirms; everything else leaves the record uncertain.
    """
    mine = [row for row in rows if row.write_id == write_id]
    if not mine:
        return "none"
    if len(mine) > 1:
        return "ambiguous"
    return "match" if exactly(mine[0].fields, expected.fields()) else "mismatch"


_ABSENT = object()


def exactly(found: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    """Whether a row's fields are exactly these: the same names, and each value equal
    *and of the same type* (``1`` is not ``True``, ``1.0`` is not ``1``: a target that
    answers another type is not answering the record)."""
    if len(found) != len(fields):
        return False
    for name, value in fields.items():
        got = found.get(name, _ABSENT)
        if got.__class__ is not value.__class__ or got != value:
            return False
    return True


#: what a reconcile verdict means, in words (``runner uncertain``, the logs); ``read_failed``
#: is the verdict of a readback that raised
READBACK_WORDS: Mapping[str, str] = {
    "match": "row found and equal",
    "none": "no row in the target",
    "ambiguous": "two or more rows in the target",
    "mismatch": "row differs",
    "read_failed": "target unreachable",
}


def readback_in_words(verdict: str | None, reconcile_attempts: int = 0) -> str:
    """A record's last reconcile verdict in words; None: not read back in this uncertain
    episode yet (or, with attempts counted, read back before verdicts were kept)."""
    if verdict is None:
        return ("not read back yet" if reconcile_attempts == 0
                else "not recorded (read back before schema v7)")
    return READBACK_WORDS.get(verdict, verdict)


def written_rows(given: object, write_ids: Sequence[str]
                 ) -> dict[str, list[TargetRow]] | str | None:
    """The rows a write returned (issue 29), by write_id: None when it returned none (the
    batch is read back); a reason when they prove nothing (not ``TargetRow`` s, a write_id
    of the request without a row, or a row of another write_id)."""
    if given is None:
        return None
    if not isinstance(given, Sequence) or isinstance(given, str | bytes):
        return "the write returned rows that are not a sequence"
    by_id: dict[str, list[TargetRow]] = {w: [] for w in write_ids}
    for row in given:
        if not isinstance(row, TargetRow) or row.write_id not in by_id:
            return "the write returned a row that is not one of the request's"
        by_id[row.write_id].append(row)
    if not all(by_id.values()):
        return "the write returned rows that do not cover the request"
    return by_id
