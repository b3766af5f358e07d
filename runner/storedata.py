"""The store's plain data and its location helpers: what Store operations take and
return (``LeadRow``, ``StoreSummary``, …), ``check_scope``, and ``open_store``, which picks
the adapter from the location.

Light on purpose: the adapters and ``runner status`` import this module, never the
``Store`` protocol (``runner.store``, which re-exports every name here), so a command
does not load the lifecycle and pipeline ports only to read the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from runner.errors import ConfigMismatch
from runner.ids import WriteId
from runner.lazy import from_module, reexport
from runner.leads.states import LeadState

if TYPE_CHECKING:
    from runner.leads.models import Scope
    from runner.storework import AcceptItem as AcceptItem
    from runner.storework import AcceptOutcome as AcceptOutcome
    from runner.storework import Decision as Decision
    from runner.storework import LeadWork as LeadWork
    from runner.storework import ObservationWrite as ObservationWrite
    from runner.storework import PollTarget as PollTarget
    from runner.storework import ResolveSubject as ResolveSubject

#: the data of the write paths lives in ``runner.storework`` and is importable from here
#: too, loaded on first use: reading the store for ``status`` never builds those classes
__getattr__ = reexport(__name__, from_module("runner.storework", (
    "AcceptItem", "AcceptOutcome", "Decision", "LeadWork", "ObservationWrite", "PollTarget",
    "ResolveSubject")))

AcceptResultKind = Literal["accepted", "duplicate", "conflict"]

#: a pinned scope as stored: its four fields (no model, so ``status`` stays light)
ScopeData = dict[str, str]


@dataclass(frozen=True)
class LeadRow:
    """A lead record as the store holds it (never the contact fields)."""

    seq: int
    tenant_id: str
    source_lead_id: str
    write_id: WriteId
    state: LeadState
    attempts: int
    reconcile_attempts: int
    snapshot: dict[str, Any] | None
    last_polled_at: str | None
    #: whether the event carries a ``contact_alias``; never its value (K7)
    contact_alias_present: bool = False


ObservationOutcome = Literal["changed", "unchanged", "missing", "failed"]


@dataclass(frozen=True)
class UncertainRow:
    """An uncertain record as ``runner uncertain`` lists it (never the contact fields)."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    attempts: int
    reconcile_attempts: int
    #: when it last became uncertain (for a record already uncertain before schema v7:
    #: its last change)
    uncertain_since: str | None
    #: the verdict of its latest readback since then (``none``, ``ambiguous``,
    #: ``mismatch``, ``read_failed``), or None before the first
    last_reconcile: str | None
    last_reconcile_at: str | None


@dataclass(frozen=True)
class StoreSummary:
    """Everything ``status`` shows except the record list (which is streamed)."""

    scope: ScopeData | None  # the pinned scope's fields (no model: status stays light)
    schema_version: int
    counts: dict[LeadState, int]
    outbox_count: int
    outbox_last_seq: int
    outbox_by_kind: dict[str, int]
    poll_health: list[dict[str, Any]] = field(default_factory=list)
    #: once something was pruned: {"floor", "count", "by_kind"} of the events removed
    #: (``runner.retention``); the counts above are of the events still in the store
    outbox_pruned: dict[str, Any] | None = None
    #: the most recent operator decisions, newest first (``runner resolve``)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def check_scope(pinned: ScopeData | None, wanted: Scope | None) -> None:
    """Refuse (exit 78) a scope that differs from the pinned one; change nothing."""
    if wanted is None or pinned is None:
        return
    want = wanted.model_dump()
    if pinned != want:
        differ = [name for name in want if pinned.get(name) != want[name]]
        raise ConfigMismatch(
            "the store is pinned to another scope ("
            + ", ".join(differ) + (" differs" if len(differ) == 1 else " differ") + "); "
            "nothing was changed"
        )


def is_postgres(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))
