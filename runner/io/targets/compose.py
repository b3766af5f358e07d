"""How a command line names its target (issue 17): the synthetic SQLite target
(``runner.io.synthetic_target``), the HTTP target (:mod:`runner.io.targets.http`), its
wire protocol and failure classification (:mod:`runner.io.targets.protocol`), the
reference server (:mod:`runner.io.targets.server`) and a user's own adapter loaded by
``--target-adapter module:factory`` (:func:`load_factory`).

:func:`open_adapter` is where a command line's ``--target`` becomes an adapter: an
``http://`` or ``https://`` URL is the HTTP target, anything else the synthetic target's
file, unless ``--target-adapter`` names a factory, which is then given the ``--target``
text as it is.  A ``postgresql://`` DSN with ``--target-table`` is the PostgreSQL table
target (:mod:`runner.io.targets.pgtable`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.errors import UsageError
from runner.leads.port import CRMAdapter


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


@dataclass(frozen=True)
class TargetOptions:
    """How a command line's target is built (``--target`` and its companions)."""

    target: str | None
    adapter: str | None = None  # --target-adapter module:factory
    token: bytes | None = field(default=None, repr=False)
    read_timeout: float = 10.0
    table: str | None = None  # --target-table: the PostgreSQL table target's table


def load_factory(spec: str) -> Callable[[str | None], CRMAdapter]:
    """``module:factory`` -> the factory (trusted code: importing it runs it)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--target-adapter {spec!r}: expected MODULE:FACTORY")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a user's module: any failure is theirs
        raise UsageError(f"--target-adapter {spec!r}: cannot import {module_name!r} "
                         f"({type(exc).__name__}: {exc})") from None
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise UsageError(f"--target-adapter {spec!r}: {module_name!r} has no {attr!r}")
    if not callable(found):
        raise UsageError(f"--target-adapter {spec!r}: {attr!r} is not callable")
    factory: Callable[[str | None], CRMAdapter] = found
    return factory


def _check_adapter(adapter: object, spec: str) -> CRMAdapter:
    missing = [name for name in ("write", "read_back", "observe_status")
               if not callable(getattr(adapter, name, None))]
    if missing:
        raise UsageError(f"--target-adapter {spec!r} made a {type(adapter).__name__} "
                         f"without {', '.join(missing)} (see 'Write a target adapter')")
    return adapter  # type: ignore[return-value]


def open_adapter(options: TargetOptions) -> CRMAdapter | None:
    """The adapter a command line names (None: no ``--target`` and no adapter).  Close it
    with :func:`close_adapter`."""
    from runner.io.targets.pgtable.names import check_table_option

    check_table_option(options.target, options.table, options.adapter)
    if options.adapter is not None:
        factory = load_factory(options.adapter)
        try:
            made = factory(options.target)
        except Exception as exc:  # noqa: BLE001 - a user's factory: any failure is theirs
            raise UsageError(f"--target-adapter {options.adapter!r} failed: "
                             f"{type(exc).__name__}: {exc}") from None
        return _check_adapter(made, options.adapter)
    if options.target is None:
        return None
    if options.table is not None:
        return _pg_table(options.target, options.table, options.read_timeout)
    if is_url(options.target):
        from runner.io.targets.http import HttpTarget, Timeouts

        return HttpTarget(options.target, token=options.token,
                          timeouts=Timeouts(read=options.read_timeout))
    from runner.io.synthetic_target import SyntheticTarget

    return SyntheticTarget(options.target)


def _pg_table(target: str, table: str, timeout: float) -> CRMAdapter:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        from runner.errors import TargetUnavailable
        from runner.io.stores import POSTGRES_INSTALL_HINT

        raise TargetUnavailable(f"the PostgreSQL table target: {POSTGRES_INSTALL_HINT}") \
            from None
    from runner.io.targets.pgtable.target import PgTableTarget

    return PgTableTarget(target, table, timeout=timeout)


def close_adapter(adapter: object) -> None:
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
