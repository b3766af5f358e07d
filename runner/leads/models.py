"""Validated models at the edges (SPEC L1, L2, L9).

Strict everywhere: ``synthetic`` is the JSON ``true`` (not ``"true"``, not ``1``), ids are
non-empty strings, no field may be added.  Values are never trimmed or case-folded:
"equal to the scope" means byte-equal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
)

from runner.errors import BadInputError
from runner.ids import WriteId

__all__ = ["CRMRecord", "LeadEvent", "Scope", "WriteId", "validate_event", "validate_scope"]

#: an id from the outside world: non-empty, bounded
Id = Annotated[StrictStr, Field(min_length=1, max_length=512)]
SCOPE_FIELDS = ("tenant_id", "account_id", "page_id", "form_id")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Scope(_Strict):
    """The single-tenant allowlist a store is pinned to (L1)."""

    tenant_id: Id
    account_id: Id
    page_id: Id
    form_id: Id


class LeadEvent(_Strict):
    """One incoming lead event (L2)."""

    tenant_id: Id
    account_id: Id
    page_id: Id
    form_id: Id
    source: Literal["meta"]
    source_lead_id: Id
    synthetic: StrictBool
    contact_alias: Annotated[StrictStr, Field(max_length=1024)] | None = None

    @field_validator("synthetic")
    @classmethod
    def _must_be_true(cls, value: bool) -> bool:
        if value is not True:
            raise ValueError("must be true (only synthetic fixtures are accepted)")
        return value

    @field_validator("contact_alias", mode="before")
    @classmethod
    def _no_null_alias(cls, value: Any) -> Any:
        # optional means "may be absent", not "may be null"
        if value is None:
            raise ValueError("must be a string when present")
        return value

    def scope_mismatches(self, scope: Scope) -> list[str]:
        """Names of the scope fields that differ from ``scope`` (exact comparison)."""
        if (self.tenant_id, self.account_id, self.page_id, self.form_id) == (
            scope.tenant_id, scope.account_id, scope.page_id, scope.form_id
        ):
            return []  # the common case, without a loop
        return [name for name in SCOPE_FIELDS if getattr(self, name) != getattr(scope, name)]


class CRMRecord(_Strict):
    """The narrower record an adapter writes (L9): what the target is allowed to see."""

    tenant: Id
    source: Literal["meta"]
    source_lead_id: Id
    is_test: StrictBool
    contact_alias: StrictStr | None = None

    def fields(self) -> dict[str, Any]:
        """The record's fields as ``model_dump()`` gives them, built directly: a batch
        needs them twice per record (the request's row and the readback's comparison),
        and ``model_dump`` costs several times more (a test keeps the two equal)."""
        return {"tenant": self.tenant, "source": self.source,
                "source_lead_id": self.source_lead_id, "is_test": self.is_test,
                "contact_alias": self.contact_alias}

    @classmethod
    def from_event(cls, event: LeadEvent) -> CRMRecord:
        return cls(
            tenant=event.tenant_id,
            source=event.source,
            source_lead_id=event.source_lead_id,
            is_test=event.synthetic,
            contact_alias=event.contact_alias,
        )


def describe_validation_error(exc: ValidationError) -> str:
    """A one-line summary of a pydantic error that never echoes an input value.  It names
    the fields: the model's own, and an unexpected field by its name (printable, quoted,
    at most ``FIELD_NAME_SHOWN`` characters: a name is input too)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(_shown_name(p) for p in err["loc"]) or "record"
        kind = err["type"]
        if kind == "extra_forbidden":
            parts.append(f"{loc}: unexpected field")
        elif kind == "missing":
            parts.append(f"{loc}: missing")
        else:
            parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


#: how much of an unexpected field's name a message shows
FIELD_NAME_SHOWN = 40


def _shown_name(part: str | int) -> str:
    """A location part as a message shows it: a plain identifier as it is; any other
    name quoted with its control and non-ASCII characters escaped, cut to
    ``FIELD_NAME_SHOWN`` characters (so a hostile key cannot forge a line or flood one)."""
    text = str(part)
    if text.isidentifier() and text.isascii() and len(text) <= FIELD_NAME_SHOWN:
        return text
    cut = text[:FIELD_NAME_SHOWN]
    return ascii(cut) + ("..." if len(text) > FIELD_NAME_SHOWN else "")


def nul_fields(model: BaseModel) -> list[str]:
    """Names of ``model``'s text fields that hold the NUL character.  One rule on both
    backends: PostgreSQL cannot store U+0000 in text, so no store accepts it."""
    return [name for name, value in model if isinstance(value, str) and "\x00" in value]


def _nul_refusal(names: list[str]) -> str:
    return "; ".join(f"{name}: must not contain the NUL character (U+0000)" for name in names)


def validate_scope(data: dict[str, Any]) -> Scope:
    try:
        scope = Scope.model_validate(data)
    except ValidationError as exc:
        raise BadInputError(
            f"invalid scope: {describe_validation_error(exc)}", reason="invalid_scope"
        ) from None
    if nul := nul_fields(scope):
        raise BadInputError(f"invalid scope: {_nul_refusal(nul)}", reason="invalid_scope")
    return scope


def validate_event(data: dict[str, Any], scope: Scope) -> LeadEvent:
    """Validate an event and check it against the scope; nothing is stored on failure."""
    try:
        event = LeadEvent.model_validate(data)
    except ValidationError as exc:
        raise BadInputError(
            f"invalid record: {describe_validation_error(exc)}", reason="invalid_record"
        ) from None
    wrong = event.scope_mismatches(scope)
    if wrong:
        verb = "differs" if len(wrong) == 1 else "differ"
        raise BadInputError(
            f"record outside scope: {', '.join(wrong)} {verb} from the scope",
            reason="scope_mismatch",
        )
    # the scope fields equal the scope's, which has no NUL; ``source`` is a literal
    if "\x00" in event.source_lead_id or "\x00" in (event.contact_alias or ""):
        raise BadInputError(f"invalid record: {_nul_refusal(nul_fields(event))}",
                            reason="invalid_record")
    return event
