"""Identifier types, kept apart from the pydantic models so that light commands
(``status``) never pay for building them."""

from typing import NewType

WriteId = NewType("WriteId", str)
