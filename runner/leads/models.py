"""Validated models at the edges (SPEC L1, L2, L9).

Strict everywhere: ``synthetic`` is the JSON ``true`` (not ``"true"``, not ``1``), ids are
non-empty strings, no field may be added.  Values are never trimmed or case-folded:
"equal to the scope" means byte-equal.
"""

from __future__ import annotations

from collections.abc import Callable
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

__all__ = ["CRMRecord", "LeadEvent", "Scope", "WriteId", "plain_canonical", "plain_event",
           "validate_event", "validate_scope"]

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


#: what sends a line to the exact path: a control character (U+0000 among them) or a
#: backslash (an escape: ``\\u0000``, a lone surrogate, a quote inside a string)
_NOT_PLAIN = bytes(range(0x20)) + b"\\"
#: a non-ASCII line is decoded first (strict UTF-8, as ``runner.jsonio`` does)
_ASCII = bytes.isascii


#: ``LeadEvent.model_validate_json`` without its wrapper (one call per bulk record)
_validate_json: Callable[[str | bytes], LeadEvent] = LeadEvent.__pydantic_validator__.validate_json


def plain_event(line: bytes, scope: Scope, limit: int) -> LeadEvent | None:
    """The event of a plain, valid, in-scope record line, parsed and validated in one
    pass (pydantic's JSON parser); ``None`` for anything else, which the caller sends
    through the exact path (``runner.jsonio.parse_object``, then ``validate_event``) for
    its exact answer.  ``None`` is always safe; an event is returned only where the
    exact path would return the same one:

    * no backslash and no control character: every string is its own text (no escape,
      so no NUL, no lone surrogate, no quote inside), and whitespace between tokens is
      the space (a tab or CR is valid JSON, but takes the exact path);
    * valid UTF-8 (decoded strictly) and at most ``limit`` bytes;
    * no duplicate key, which pydantic would resolve (last wins) where ``parse_json``
      refuses: in a valid event every value is a string but ``synthetic`` (``true``), so
      with no escapes the line holds exactly ``2 * (2 * fields - 1)`` quotes, and any
      repeated key adds at least two;
    * all scope fields equal the scope's (a mismatch takes the exact path for its
      message).

    Its canonical JSON is ``plain_canonical(event)``.
    """
    if len(line) > limit or len(line.translate(None, _NOT_PLAIN)) != len(line):
        return None
    try:
        event = _validate_json(line if _ASCII(line) else line.decode("utf-8"))
    except (ValidationError, UnicodeDecodeError):
        return None
    if line.count(b'"') != 4 * len(event.__pydantic_fields_set__) - 2:
        return None
    if (event.tenant_id, event.account_id, event.page_id, event.form_id) != (
            scope.tenant_id, scope.account_id, scope.page_id, scope.form_id):
        return None
    return event


def _plain_template(names: list[str]) -> str:
    """The canonical JSON of a plain event with these fields, as a ``str.format_map``
    template: sorted keys, compact; ``synthetic`` is ``true``, every other value a string
    that needs no escape (a plain line has none), so is written as it is."""
    parts = ['"synthetic":true' if name == "synthetic" else f'"{name}":"{{{name}}}"'
             for name in sorted(names)]
    return "{{" + ",".join(parts) + "}}"


#: every field is required but ``contact_alias``: a valid event has the required ones,
#: with or without it
_REQUIRED = [name for name, info in LeadEvent.model_fields.items() if info.is_required()]
_PLAIN_TEMPLATES = {False: _plain_template(_REQUIRED),
                    True: _plain_template([*_REQUIRED, "contact_alias"])}


def plain_canonical(event: LeadEvent) -> str:
    """The canonical JSON (``runner.jsonio.canonical``) of the record a plain line
    (``plain_event``) holds: the fields the line has, formatted directly."""
    has_alias = "contact_alias" in event.__pydantic_fields_set__
    return _PLAIN_TEMPLATES[has_alias].format_map(event.__dict__)


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
