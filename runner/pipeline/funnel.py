"""The built-in pipeline: the lead funnel (SPEC P11).

::

    D1 outbox:<seq>          a lead event (raw ingestion)
    D2 lead-fact:<seq>       lead-facts@1: the event as a normalized lead fact
    D3 lead:<tenant>:<lead>  lead-current@1: one current row per lead, merged by sequence
    D4 funnel:<tenant>:<lead> lead-funnel@1: the lead's form and latest observed status,
                              counted while the lead is confirmed

``status`` shows ``"funnel": {form_id: {status: count}}``: the D4 entries counted per form
and status.  A lead's status is ``new`` until a status is first observed.  These are
counts of CRM statuses of delivered (confirmed) leads as the target reported them: not
verified people, not sales, not revenue.  A lead whose row went missing from the target
(``confirmed_then_missing``) is no longer counted.

D4 holds one entry per lead rather than the counts themselves, so that projecting a lead
twice (a retry, a replay) can never count it twice: the counts are computed from the
entries when read.  Leads are named by key; no level holds a contact field.
"""

from __future__ import annotations

from typing import Any

from runner.pipeline.builtin import LEAD_CURRENT, LEAD_FACTS, LEAD_FUNNEL
from runner.pipeline.engine import Processor
from runner.pipeline.model import (
    FUNNEL_KEY_PREFIX,
    Item,
    Outcome,
    Output,
    no_output,
    not_applicable,
    output,
    unsupported,
)

FACT_PREFIX = "lead-fact:"
LEAD_PREFIX = "lead:"
NEW_STATUS = "new"
#: delivery states after which a lead has been delivered (and may be in the funnel)
DELIVERED = ("confirmed", "confirmed_then_missing")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class LeadFacts(Processor):
    """D1 -> D2: a lead event becomes a normalized lead fact (a versioned mapper)."""

    ref = LEAD_FACTS

    def process_one(self, item: Item) -> Outcome:
        p = item.payload
        kind, data = p.get("kind"), p.get("data")
        if kind not in ("accepted", "state_changed", "status_changed"):
            return not_applicable()
        lead, tenant, seq = _text(p.get("lead")), _text(p.get("tenant_id")), p.get("seq")
        if lead is None or tenant is None or not isinstance(seq, int) \
                or not isinstance(data, dict):
            return unsupported()
        fact: dict[str, Any] = {"lead": lead, "tenant_id": tenant, "seq": seq,
                                "at": p.get("at")}
        if kind == "accepted":
            fact.update(fact="accepted", delivery_state=_text(data.get("state")) or "prepared")
            if _text(p.get("form_id")):
                fact["form_id"] = p["form_id"]
        elif kind == "state_changed":
            to = _text(data.get("to"))
            if to is None:
                return unsupported()
            fact.update(fact="delivery", delivery_state=to)
        else:
            status = _text(data.get("status"))
            if status is None:  # a missing row or a snapshot without a status
                return no_output()
            fact.update(fact="status", status=status)
        return output(Output(f"{FACT_PREFIX}{seq}", fact))


class LeadCurrent(Processor):
    """D2 -> D3: one current row per lead; each field keeps its latest value by outbox
    sequence, whatever order the facts are materialized in."""

    ref = LEAD_CURRENT

    def process_one(self, item: Item) -> Outcome:
        if not item.key.startswith(FACT_PREFIX):
            return not_applicable()
        f = item.payload
        lead, tenant, seq = _text(f.get("lead")), _text(f.get("tenant_id")), f.get("seq")
        if lead is None or tenant is None or not isinstance(seq, int):
            return unsupported()
        fields: dict[str, Any] = {"lead": lead, "tenant_id": tenant}
        if f.get("fact") == "status":
            fields["status"] = f.get("status")
        else:
            fields["delivery_state"] = f.get("delivery_state")
        if _text(f.get("form_id")):
            fields["form_id"] = f["form_id"]
        return output(Output(f"{LEAD_PREFIX}{tenant}:{lead}", fields, order=seq))


class LeadFunnel(Processor):
    """D3 -> D4: a delivered lead's funnel entry (form, latest status, counted)."""

    ref = LEAD_FUNNEL

    def process_one(self, item: Item) -> Outcome:
        if not item.key.startswith(LEAD_PREFIX):
            return not_applicable()
        row = item.payload
        state, form = row.get("delivery_state"), _text(row.get("form_id"))
        if state not in DELIVERED or form is None:
            return no_output()  # not delivered yet, or its accepted fact is not in yet
        entry = {"form_id": form, "status": _text(row.get("status")) or NEW_STATUS,
                 "counted": state == "confirmed"}
        key = f"{FUNNEL_KEY_PREFIX}{item.key.removeprefix(LEAD_PREFIX)}"
        return output(Output(key, entry))


def processors() -> list[Processor]:
    return [LeadFacts(), LeadCurrent(), LeadFunnel()]
