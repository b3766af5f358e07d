"""The default registry: the built-in lead funnel processors, then each plugin module's
``register(registry)`` (``--plugin MODULE``; trusted code, it runs as runner)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from runner.errors import UsageError
from runner.pipeline import funnel
from runner.pipeline.engine import Registry


def default_registry(plugins: Sequence[str] = ()) -> Registry:
    """The built-in lead funnel processors, then each plugin module's ``register``."""
    registry = Registry()
    for proc in funnel.processors():
        registry.register(proc)
    for name in plugins:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:  # a parent package that is missing
            raise UsageError(f"cannot import plugin {name!r}: {exc}") from None
        if found is None:
            raise UsageError(f"cannot import plugin {name!r}: no module of that name")
        try:
            # stdout carries runner's JSON lines only: what a module prints as it is
            # imported goes to stderr
            with contextlib.redirect_stdout(sys.stderr):
                module = importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"cannot import plugin {name!r}: {exc}") from None
        hook = getattr(module, "register", None)
        if not callable(hook):
            raise UsageError(f"plugin {name!r} has no register(registry) function")
        hook(registry)
    return registry
