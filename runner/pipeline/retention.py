"""The pipeline's retention (issue 15 point 11): ``runner pipeline prune --before AGE|TIME``.

Every lead event becomes a D1 record (``outbox:<seq>``) and a D2 fact
(``lead-fact:<seq>``), each with its work rows, and every fact rewrites the lead's D3
record and its D4 funnel entry, each rewrite leaving a row of history and a replaced
outcome.  Without retention all of it stays forever (a 10-minute soak: 116 MB of store).
A prune removes what is **finished and older than the cutoff**, and nothing that any
worker, job or reader still needs:

* **Kept always: the current records.**  Merged records (D3 ``lead:…``: a record whose
  fields are merged from many inputs, each field stamped with the outbox sequence that set
  it, so a later fact merges into it) and D4 (``funnel:…``, what ``status`` reads) are
  never removed, nor are their current outcomes: one of each per lead.
* **Removed: finished per-event records** (D1, D2, and a non-merged D3), when every one of
  these holds: the record was last written before the cutoff; a processor reads its
  level (one is registered: a level no worker or job has read yet is kept whole); every
  work row on it is
  ``done``, with its outcome recorded before the cutoff (nothing pending, retrying,
  claimed or leased); it is in no current processor's backlog (each processor of the next
  stage has a terminal outcome for it at its current version, or at any version for one
  that declares ``rebacklog_on_version_bump=False``); no kept non-merged record was made
  from it (a D1 record goes with its D2 fact, never before it); and, for D1, its outbox
  event is gone (at or below the outbox's prune floor, ``outbox prune``): the raw
  retriever counts an outbox event with no D1 record as its backlog, so a D1 record whose
  event is still there would be ingested again.  The record goes with its work rows, its
  history and its replaced outcomes.
* **Removed: history older than the cutoff** (``pipeline_history``, the payloads that were
  replaced, and ``pipeline_outcome_history``, the outcomes that were replaced).  No
  processor reads them: they answer "what did this record say before", for as long as
  the operator keeps them.

What replay means after a prune: a force replay (``job replay-* --force``) recomputes
from the inputs still kept.  The outbox's prune floor is already the horizon of raw
ingestion (events below it are gone); the pipeline's prune carries the same horizon down
to D1 and D2.  The current records stay as they are: a replay of the facts still kept
merges into D3 by sequence, so a field set by a removed fact keeps its value until a
newer fact replaces it.  A new processor version applies to what is kept.

The schema enforces the same rules (migration v10, both backends): a work row is
deleted only once done; a record only with no work row left on it, read by some
processor, not merged, not at D4, with no kept non-merged record made from it, and (at
D1) once its outbox event is gone.

A prune runs in rounds of at most ``--batch`` records per level, each round one
transaction that records what it removed (``pipeline_prunes``); on PostgreSQL a round
holds pipeline writers (claims, completions, ingestion) back until it commits, as
registering a processor version does.  ``--dry-run`` runs the same rounds in one
transaction and rolls it back, so its figures are exactly what a prune would remove now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from runner.errors import UsageError

#: the schema version that lets ``pipeline prune`` remove rows
PIPELINE_RETENTION_VERSION = 10
#: records per level per round (one transaction each)
PRUNE_BATCH = 2000
#: what ``removed`` counts, in the order the answer prints it
REMOVED_KINDS = ("D1", "D2", "D3", "work", "history", "outcome_history")

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_cutoff(value: str, now: datetime) -> datetime:
    """``--before``: an age (``90s``, ``15m``, ``12h``, ``7d``: that long before ``now``) or
    an ISO-8601 time with a timezone.  A cutoff after ``now`` is refused: "older than a
    time that has not come" would be every row, including what was written a moment ago.
    """
    from runner.clock import EARLIEST, parse_now

    if (age := _AGE.match(value)) is not None:
        seconds = float(age.group(1)) * _UNITS[age.group(2)]
        if seconds > (now - EARLIEST).total_seconds():
            raise UsageError(f"--before {value!r} reaches back before {EARLIEST.year}")
        return now - timedelta(seconds=seconds)
    if value.strip()[:1].isdigit() and "-" not in value:
        raise UsageError(f"--before {value!r}: an age needs a unit (s, m, h or d), "
                         "for example 7d")
    at = parse_now(value, "--before")
    if at > now:
        raise UsageError(f"--before {value!r} is in the future; prune takes an age "
                         "(7d) or a past time")
    return at


@dataclass(frozen=True)
class PipelinePrune:
    """What ``pipeline prune`` removed (or, with ``dry_run``, would remove now)."""

    before: str  # the cutoff, as fixed-width UTC text
    dry_run: bool
    rounds: int
    outbox_floor: int  # D1 records of events above it are kept
    removed: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"before": self.before, "dry_run": self.dry_run, "rounds": self.rounds,
                "outbox_floor": self.outbox_floor,
                "removed": {k: self.removed.get(k, 0) for k in REMOVED_KINDS}}
