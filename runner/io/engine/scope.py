"""The scope pinned into a store, as a model built on first use (``status`` never needs
it, and never loads pydantic)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.models import Scope
    from runner.storedata import ScopeData


class PinnedScope:
    scope_data: ScopeData | None
    _scope: Scope | None

    @property
    def scope(self) -> Scope | None:
        if self._scope is None and self.scope_data is not None:
            from runner.models import Scope

            self._scope = Scope.model_validate(self.scope_data)
        return self._scope
