from __future__ import annotations

import pytest

from runner.errors import BadInputError
from runner.leads.models import CRMRecord, Scope, validate_event, validate_scope
from tests.helpers import CANARY, SCOPE, event

SCOPE_MODEL = Scope.model_validate(SCOPE)


def reason_of(doc: dict) -> str:
    with pytest.raises(BadInputError) as info:
        validate_event(doc, SCOPE_MODEL)
    return info.value.reason


def test_valid_event_passes_and_maps_to_crm_record() -> None:
    ev = validate_event(event(1), SCOPE_MODEL)
    record = CRMRecord.from_event(ev)
    assert record.model_dump() == {
        "tenant": SCOPE["tenant_id"], "source": "meta", "source_lead_id": "lead-1",
        "is_test": True, "contact_alias": "alias-1",
    }


@pytest.mark.parametrize("alias", [True, False], ids=["alias", "no-alias"])
def test_a_crm_records_fields_are_its_model_dump(alias: bool) -> None:
    """``fields()`` is the fast ``model_dump()`` the HTTP target's rows and every readback
    comparison use: the same keys, in the same order, and the same values."""
    doc = event(1)
    if not alias:
        del doc["contact_alias"]
    record = CRMRecord.from_event(validate_event(doc, SCOPE_MODEL))
    assert list(record.fields().items()) == list(record.model_dump().items())
    assert list(record.fields()) == list(CRMRecord.model_fields)


def test_contact_alias_is_optional() -> None:
    doc = event(1)
    del doc["contact_alias"]
    assert validate_event(doc, SCOPE_MODEL).contact_alias is None


@pytest.mark.parametrize("value", ["true", 1, 1.0, "yes", None, False, 0])
def test_synthetic_must_be_json_true(value: object) -> None:
    assert reason_of(event(1, synthetic=value)) == "invalid_record"


@pytest.mark.parametrize("field", ["tenant_id", "account_id", "page_id", "form_id"])
def test_each_scope_field_must_match_exactly(field: str) -> None:
    assert reason_of(event(1, **{field: SCOPE[field] + "x"})) == "scope_mismatch"
    # no trimming and no case folding
    assert reason_of(event(1, **{field: " " + SCOPE[field]})) == "scope_mismatch"
    assert reason_of(event(1, **{field: SCOPE[field].upper()})) == "scope_mismatch"


@pytest.mark.parametrize(
    "doc",
    [
        event(1, source="Meta"),
        event(1, source="google"),
        event(1, source_lead_id=""),
        event(1, source_lead_id=7),
        event(1, contact_alias=None),
        event(1, contact_alias=12),
        event(1, extra_field="x"),
        {k: v for k, v in event(1).items() if k != "source_lead_id"},
        {k: v for k, v in event(1).items() if k != "synthetic"},
        {k: v for k, v in event(1).items() if k != "tenant_id"},
        event(1, tenant_id=None),
        event(1, source_lead_id="x" * 513),
    ],
)
def test_bad_events_are_rejected(doc: dict) -> None:
    assert reason_of(doc) == "invalid_record"


def test_rejection_message_never_echoes_values() -> None:
    with pytest.raises(BadInputError) as info:
        validate_event(event(1, contact_alias=["secret-canary"], synthetic="true"), SCOPE_MODEL)
    assert "secret-canary" not in info.value.message
    assert "contact_alias" in info.value.message


@pytest.mark.parametrize(
    "doc",
    [
        {**SCOPE, "tenant_id": ""},
        {k: v for k, v in SCOPE.items() if k != "form_id"},
        {**SCOPE, "extra": "x"},
        {**SCOPE, "page_id": 5},
    ],
)
def test_bad_scopes_are_rejected(doc: dict) -> None:
    with pytest.raises(BadInputError) as info:
        validate_scope(doc)
    assert info.value.reason == "invalid_scope"


def test_an_unexpected_field_is_named_and_its_value_never_echoed() -> None:
    with pytest.raises(BadInputError) as info:
        validate_event({**event(1), "colour": CANARY, "x": 2}, Scope.model_validate(SCOPE))
    assert "colour: unexpected field" in info.value.message
    assert "x: unexpected field" in info.value.message
    assert CANARY not in info.value.message


def test_a_hostile_unexpected_field_name_is_escaped_and_cut() -> None:
    name = "fake\n12:00:00 lead.confirmed \x1b[31m" + "y" * 100
    with pytest.raises(BadInputError) as info:
        validate_event({**event(1), name: 1}, Scope.model_validate(SCOPE))
    message = info.value.message
    assert "\n" not in message and "\x1b" not in message
    assert "y" * 41 not in message
    assert message.startswith("invalid record: 'fake\\n12:00:00")
