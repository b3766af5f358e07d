"""The store's plain data: what Store operations take and return (``LeadRow``,
``StoreSummary``, the write paths' ``AcceptItem``, ``LeadWork``, ``Decision``, …), and
``check_scope`` (with ``GivenScope``, a scope as a command read it).  Opening a store is
composition, at the edge: ``runner.io.stores``.

Light on purpose: the adapters and ``runner status`` import this module, never the
``Store`` protocol (``runner.store``, which re-exports every name here), so a command
does not load the lifecycle and pipeline ports only to read the store.  Its records are
named tuples: on Python 3.11 a frozen dataclass costs about four times as much to build
(callgrind: ~3.8M instructions, a named tuple ~0.7-1.0M).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from runner.errors import ConfigMismatch
from runner.ids import WriteId
from runner.leads.states import LeadState

if TYPE_CHECKING:
    from runner.leads.models import LeadEvent, Scope


AcceptResultKind = Literal["accepted", "duplicate", "conflict"]

#: a pinned scope as stored: its four fields (no model, so ``status`` stays light)
ScopeData = dict[str, str]


class LeadRow(NamedTuple):
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
    #: failed_safe or uncertain: why, in words (v13: a rejected write's reason; v17: every
    #: failure), and its kind (v17: ``runner.leads.port.FAILURES``); None otherwise
    last_error: str | None = None
    last_failure: str | None = None


ObservationOutcome = Literal["changed", "unchanged", "missing", "failed"]


class UncertainRow(NamedTuple):
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
    #: why it is uncertain: the failure of the send that made it so, in words and its kind
    #: (v17: ``runner.leads.port.FAILURES``); None when not known (uncertain before v17)
    last_error: str | None = None
    last_failure: str | None = None


class StoreSummary(NamedTuple):
    """Everything ``status`` shows except the record list (which is streamed)."""

    scope: ScopeData | None  # the pinned scope's fields (no model: status stays light)
    schema_version: int
    counts: dict[LeadState, int]
    outbox_count: int
    outbox_last_seq: int
    outbox_by_kind: dict[str, int]
    poll_health: list[dict[str, Any]]
    #: once something was pruned: {"floor", "count", "by_kind"} of the events removed
    #: (``runner.retention``); the counts above are of the events still in the store
    outbox_pruned: dict[str, Any] | None
    #: the most recent operator decisions, newest first (``runner resolve``)
    decisions: list[dict[str, Any]]
    #: failed_safe records waiting for their backoff (issue 16): {"waiting": n,
    #: "next_attempt_at": the earliest of their next attempts, or None, "rejected": how
    #: many failed_safe records the target rejected, with its reason (v13)}
    retries: dict[str, Any]


class GivenScope:
    """A scope as a command read it from its file, not validated yet.

    The delivery commands (``once``, ``start``, ``poll-status``) only compare their scope
    with the one their store is pinned to, and that one was validated when it was pinned:
    a scope equal to it, field for field and value for value, is valid by that proof, and
    the validation (pydantic, the largest part of an idle ``once``'s start-up) is not run
    again.  (``observe`` validates it to check its record against it.)  Anything else is
    validated by the one rule, ``runner.leads.models.validate_scope``, before it is
    compared (an invalid scope is refused as invalid first, as it always was) or pinned
    (``model_dump_json``)."""

    __slots__ = ("_valid", "fields")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self._valid: Scope | None = None

    def validated(self) -> Scope:
        """The scope validated (exit 65 ``invalid_scope`` if it is not valid)."""
        if self._valid is None:
            from runner.leads.models import validate_scope

            self._valid = validate_scope(dict(self.fields))
        return self._valid

    def model_dump(self) -> dict[str, Any]:
        """The fields as given (to compare with the pin; ``check_scope`` validates them
        if they differ)."""
        return dict(self.fields)

    def model_dump_json(self) -> str:
        """The validated scope's JSON, to pin it."""
        return self.validated().model_dump_json()


#: a scope a store is opened with: a validated one, or one as given (``GivenScope``)
WantedScope: TypeAlias = "Scope | GivenScope"


def check_scope(pinned: ScopeData | None, wanted: WantedScope | None) -> None:
    """Refuse (exit 78) a scope that differs from the pinned one; change nothing.  A
    given scope that differs is validated first (exit 65 if it is not valid)."""
    if wanted is None or pinned is None:
        return
    want = wanted.model_dump()
    if pinned != want:
        if isinstance(wanted, GivenScope):
            want = wanted.validated().model_dump()
        differ = [name for name in want if pinned.get(name) != want[name]]
        raise ConfigMismatch(
            "the store is pinned to another scope ("
            + ", ".join(differ) + (" differs" if len(differ) == 1 else " differ") + "); "
            "nothing was changed"
        )


def is_postgres(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


# -- the data the write paths exchange with the store: accepting events, the delivery
# -- cycle, operators' decisions and status polls


class AcceptOutcome(NamedTuple):
    result: AcceptResultKind
    write_id: WriteId


class AcceptItem(NamedTuple):
    """One validated event to accept, with its canonical JSON and a fresh write_id (used
    only if the key is new)."""

    event: LeadEvent
    canonical: str
    write_id: WriteId


class LeadWork(NamedTuple):
    """A record the cycle works on: its key, write_id, state and validated event."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    state: LeadState
    event: LeadEvent


class ResolveSubject(NamedTuple):
    """A record an operator names by write_id: its work (key, state, event) and its
    ``attempts`` (a decision is bound to the uncertain episode at that count)."""

    work: LeadWork
    tenant_id: str
    attempts: int


class Decision(NamedTuple):
    """An operator's recorded decision on an uncertain record (``runner resolve``).

    ``decision``: ``confirmed`` (the operator verified the row by other means) or
    ``not_sent`` (a fresh readback found no row: the record becomes sendable again,
    ``failed_safe``).  ``readback``: that readback's verdict, None when none was made.
    """

    tenant_id: str
    source_lead_id: str
    write_id: WriteId
    decision: Literal["confirmed", "not_sent"]
    reason: str
    readback: str | None
    attempts: int

    @property
    def to_state(self) -> LeadState:
        return LeadState.CONFIRMED if self.decision == "confirmed" else LeadState.FAILED_SAFE


class Requeue(NamedTuple):
    """Uncertain records to send again, authorised by runner itself (SPEC E7, v17): the
    store's target deduplicates by write_id and a fresh readback found no row for them.
    Each still uncertain gets a kept ``resend_authorizations`` row (with its outbox event)
    at its current attempts and becomes ``failed_safe``, due at ``due(attempts)`` (the
    highest attempts among them: the records of one request stay one batch) with
    ``reason`` as its ``last_error``.  ``target_id``: the pinned target (None: the adapter
    cannot be pinned)."""

    write_ids: Sequence[WriteId]
    target_id: str | None
    due: Callable[[int], datetime]
    reason: str
    #: None: the target deduplicates by write_id; ``fence``: its fence stands above
    #: every batch of a history the store forgot (SPEC E8, v18)
    evidence: str | None = None


class DecisionBatch(NamedTuple):
    """One operator decision for many uncertain records (``runner resolve --all``): the
    same ``decision``, ``reason`` and fresh ``readback`` verdict (``none`` for
    ``not_sent``, ``match`` for ``confirmed``) for each, each record bound to the
    ``attempts`` it had when it was read back (``records``: ``(write_id, attempts)``)."""

    decision: Literal["confirmed", "not_sent"]
    reason: str
    readback: str
    records: tuple[tuple[WriteId, int], ...]

    @property
    def to_state(self) -> LeadState:
        return LeadState.CONFIRMED if self.decision == "confirmed" else LeadState.FAILED_SAFE


class PollTarget(NamedTuple):
    """A confirmed record due for a status poll, with its last snapshot (canonical JSON)."""

    seq: int
    source_lead_id: str
    write_id: WriteId
    snapshot: str | None


class ObservationWrite(NamedTuple):
    """What to store for one observation (L11): ``changed`` stores ``snapshot`` (canonical
    JSON) and writes a ``status_changed`` event; ``unchanged`` and ``failed`` only move the
    poll time; ``missing`` makes the record ``confirmed_then_missing``."""

    write_id: WriteId
    outcome: ObservationOutcome
    snapshot: str | None = None
