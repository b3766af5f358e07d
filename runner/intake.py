"""Accepting events into the durable inbox (SPEC L2, L3).

Validation is pure and happens before the store is touched, so a bad input leaves the
store exactly as it was (not even created).  The answer is given only after the commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runner import crashpoints
from runner.clock import Clock
from runner.errors import BadInputError
from runner.jsonio import canonical
from runner.models import LeadEvent, Scope, WriteId, validate_event
from runner.store import Store

log = logging.getLogger("runner.intake")

Result = Literal["accepted", "duplicate", "rejected"]


@dataclass(frozen=True)
class AcceptResult:
    """The answer to one accept (L13): ``accepted`` and ``duplicate`` are success."""

    result: Result
    source_lead_id: str | None
    write_id: WriteId | None
    reason: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.result != "rejected"

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else BadInputError.exit_code

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "result": self.result,
            "source_lead_id": self.source_lead_id,
            "write_id": self.write_id,
        }
        if self.reason is not None:
            doc["reason"] = self.reason
        return doc


def rejected(data: Any, error: BadInputError) -> AcceptResult:
    """A rejection that names the record by key when the input had a usable one."""
    key = data.get("source_lead_id") if isinstance(data, Mapping) else None
    return AcceptResult(
        "rejected",
        key if isinstance(key, str) and key else None,
        None,
        reason=error.reason,
        message=error.message,
    )


def prepare(data: Mapping[str, Any] | LeadEvent, scope: Scope) -> tuple[LeadEvent, str]:
    """Validate an event against the scope and return it with its canonical JSON."""
    raw = data.model_dump(exclude_unset=True) if isinstance(data, LeadEvent) else dict(data)
    event = validate_event(raw, scope)
    return event, canonical(raw)


async def accept(
    store: Store, clock: Clock, scope: Scope, data: Mapping[str, Any] | LeadEvent
) -> AcceptResult:
    """Validate, then commit, then answer.  Bad input is a ``rejected`` answer, not an
    exception; store failures raise."""
    try:
        event, text = prepare(data, scope)
    except BadInputError as exc:
        log.debug("record rejected: %s", exc.message,
                  extra={"action": "lead.rejected", "reason": exc.reason})
        return rejected(data, exc)
    crashpoints.hit("accept.before-commit")
    outcome = await store.accept(event, text, WriteId(str(uuid.uuid4())), clock.now())
    crashpoints.hit("accept.after-commit")
    key = event.source_lead_id
    if outcome.result == "conflict":
        message = "another record with different content was already accepted under this key"
        log.debug("record rejected: conflict",
                  extra={"action": "lead.rejected", "key": key, "reason": "conflict"})
        return AcceptResult("rejected", key, None, "conflict", message)
    log.info("record %s", outcome.result,
             extra={"action": f"lead.{outcome.result}", "key": key,
                    "write_id": outcome.write_id})
    return AcceptResult(outcome.result, key, outcome.write_id)
