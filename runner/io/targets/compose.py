"""How a command line names its target (issue 17): the synthetic SQLite target
(``runner.io.synthetic_target``), the HTTP target (:mod:`runner.io.targets.http`), its
wire protocol and failure classification (:mod:`runner.io.targets.protocol`), the
reference server (:mod:`runner.io.targets.server`) and a user's own adapter loaded by
``--target-adapter module:factory`` (:func:`load_factory`).

:func:`open_adapter` is where a command line's ``--target`` becomes an adapter: an
``http://`` or ``https://`` URL is the HTTP target, anything else the synthetic target's
file, unless ``--target-adapter`` names a factory, which is then given the ``--target``
text as it is, and its :class:`~runner.leads.settings.TargetSettings` when it has a
parameter named ``settings`` (issue 29).  A ``postgresql://`` DSN with ``--target-table``
is the PostgreSQL table target (:mod:`runner.io.targets.pgtable`).

Nothing the command line gives is dropped: each built-in target declares the companion
flags it takes (:class:`BuiltinTarget`), :func:`check_given` refuses the others before
anything is opened, and a factory without ``settings`` is refused when any were given.
This module imports no driver and no model, so every command (``status`` too) can check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.errors import UsageError
from runner.leads.settings import TargetSettings

if TYPE_CHECKING:
    from runner.leads.port import CRMAdapter

#: the companion flags of ``--target``, as :attr:`TargetOptions.given` names them
TOKEN_FLAG = "--target-token-file"  # noqa: S105 - a flag's name, not a secret
TIMEOUT_FLAG = "--target-timeout"
OPTION_FLAG = "--target-option"


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


#: how a SQLite file named as a ``--target`` must end (or be given as ``sqlite:PATH``)
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
SQLITE_PREFIX = "sqlite:"
_SCHEMES = ("https", "http", "postgresql", "postgres")


def check_target_text(target: str) -> str:
    """A built-in ``--target`` as runner will use it, or a ``UsageError`` (exit 2): an
    ``http(s)://`` URL or a ``postgresql://`` DSN as it is; a SQLite file's path when it
    ends in ``.db``, ``.sqlite`` or ``.sqlite3``, or is given as ``sqlite:PATH`` (the
    prefix taken off).  Anything else is a typo, never a new file: ``htp:sheet`` would
    otherwise become a target, pinned.  A URL that lost its ``:`` or a ``/`` gets "did you
    mean".  (With ``--target-adapter`` the factory takes any text: not checked here.)"""
    if target.startswith((*(f"{scheme}://" for scheme in _SCHEMES),)):
        return target
    if target.startswith(SQLITE_PREFIX):
        path = target.removeprefix(SQLITE_PREFIX)
        if not path:
            raise UsageError("--target sqlite: needs the target file's path after the colon")
        return path
    if target.lower().endswith(SQLITE_SUFFIXES):
        return target
    hint = ""
    lowered = target.lower()
    for scheme in _SCHEMES:
        if lowered.startswith(scheme) and lowered[len(scheme):len(scheme) + 1] in (":", "/"):
            hint = f"; did you mean {scheme}://{target[len(scheme):].lstrip(':/')}?"
            break
    raise UsageError(f"--target {target!r} is not a target: give an http(s):// URL, a "
                     "postgresql:// DSN (with --target-table), or a SQLite file ending in "
                     f".db, .sqlite or .sqlite3 (any other name as sqlite:PATH){hint}")


@dataclass(frozen=True)
class BuiltinTarget:
    """A target runner ships, and the companion flags it takes: ``--target-token-file``,
    ``--target-timeout``, or ``--target-option KEY`` for each option key it reads."""

    name: str
    takes: frozenset[str] = frozenset()


HTTP_TARGET = BuiltinTarget("HTTP target", frozenset({TOKEN_FLAG, TIMEOUT_FLAG}))
SYNTHETIC_TARGET = BuiltinTarget("synthetic target (a SQLite file)")
#: its table is ``--target-table``, checked on its own (``pgtable.names``)
PG_TABLE_TARGET = BuiltinTarget("PostgreSQL table target", frozenset({TIMEOUT_FLAG}))


def builtin_target(target: str) -> BuiltinTarget:
    """The built-in target a ``--target`` names without ``--target-adapter``."""
    if is_url(target):
        return HTTP_TARGET
    if target.startswith(("postgresql://", "postgres://")):
        return PG_TABLE_TARGET
    return SYNTHETIC_TARGET


def _listed(flags: Sequence[str]) -> str:
    return ", ".join(flags)


def check_given(target: str | None, adapter: str | None, given: Sequence[str]) -> None:
    """Refuse (exit 2) the companion flags nothing would take: ``given`` names them
    (``--target-timeout``, ``--target-option region``).  A factory's own answer is
    checked when it is loaded (:func:`open_adapter`)."""
    if adapter is not None or not given:
        return
    if target is None:
        raise UsageError(f"{_listed(given)} needs --target (or --target-adapter)")
    builtin = builtin_target(target)
    refused = [flag for flag in given if flag not in builtin.takes]
    if refused:
        hints = []
        if any(flag.startswith(OPTION_FLAG) for flag in refused):
            hints.append(f"{OPTION_FLAG} is for a --target-adapter factory")
        if any(not flag.startswith(OPTION_FLAG) for flag in refused):
            hints.append(f"{TOKEN_FLAG} is for an http(s):// --target or a factory, "
                         f"{TIMEOUT_FLAG} for those and a postgresql:// --target")
        raise UsageError(f"the {builtin.name} takes no {_listed(refused)} "
                         f"({'; '.join(hints)})")


@dataclass(frozen=True)
class TargetOptions:
    """How a command line's target is built (``--target`` and its companions)."""

    target: str | None
    adapter: str | None = None  # --target-adapter module:factory
    settings: TargetSettings = field(default_factory=TargetSettings)
    #: the companion flags the command line gave (``--target-option region``…), for
    #: refusals: what a target or a factory cannot take is an error, never dropped
    given: tuple[str, ...] = ()
    table: str | None = None  # --target-table: the PostgreSQL table target's table


def load_factory(spec: str) -> Callable[..., CRMAdapter]:
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
    factory: Callable[..., CRMAdapter] = found
    return factory


def _check_adapter(adapter: object, spec: str) -> CRMAdapter:
    missing = [name for name in ("write", "read_back", "observe_status")
               if not callable(getattr(adapter, name, None))]
    if missing:
        raise UsageError(f"--target-adapter {spec!r} made a {type(adapter).__name__} "
                         f"without {', '.join(missing)} (see 'Write a target adapter')")
    return adapter  # type: ignore[return-value]


def takes_settings(factory: Callable[..., Any]) -> bool:
    """Whether a factory has a parameter named ``settings`` that a keyword can fill (its
    signature, read once; a callable without one takes only the target)."""
    import inspect

    try:
        parameter = inspect.signature(factory).parameters.get("settings")
    except (TypeError, ValueError):  # a callable Python cannot describe: one argument
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _make(options: TargetOptions, spec: str) -> object:
    factory = load_factory(spec)
    with_settings = takes_settings(factory)
    if options.given and not with_settings:
        raise UsageError(
            f"--target-adapter {spec!r} takes no settings, but {_listed(options.given)} "
            f"{'was' if len(options.given) == 1 else 'were'} given: give the factory a "
            "parameter named settings (def make(target, settings): ...; see 'Write a "
            "target adapter')")
    try:
        if with_settings:
            return factory(options.target, settings=options.settings)
        return factory(options.target)
    except Exception as exc:  # noqa: BLE001 - a user's factory: any failure is theirs
        raise UsageError(f"--target-adapter {spec!r} failed: "
                         f"{type(exc).__name__}: {exc}") from None


def open_adapter(options: TargetOptions) -> CRMAdapter | None:
    """The adapter a command line names (None: no ``--target`` and no adapter).  Close it
    with :func:`close_adapter`."""
    from runner.io.targets.pgtable.names import check_table_option

    check_given(options.target, options.adapter, options.given)
    check_table_option(options.target, options.table, options.adapter)
    if options.adapter is not None:
        return _check_adapter(_make(options, options.adapter), options.adapter)
    if options.target is None:
        return None
    if options.table is not None:
        return _pg_table(options.target, options.table, options.settings.timeout)
    if is_url(options.target):
        from runner.io.targets.http import HttpTarget, Timeouts

        timeout = options.settings.timeout
        return HttpTarget(options.target, token=options.settings.token,
                          timeouts=Timeouts() if timeout is None else Timeouts(read=timeout))
    from runner.io.synthetic_target import SyntheticTarget

    return SyntheticTarget(options.target)


def _pg_table(target: str, table: str, timeout: float | None) -> CRMAdapter:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        from runner.errors import TargetUnavailable
        from runner.io.stores import POSTGRES_INSTALL_HINT

        raise TargetUnavailable(f"the PostgreSQL table target: {POSTGRES_INSTALL_HINT}") \
            from None
    from runner.io.targets.pgtable.session import DEFAULT_TIMEOUT
    from runner.io.targets.pgtable.target import PgTableTarget

    return PgTableTarget(target, table,
                         timeout=DEFAULT_TIMEOUT if timeout is None else timeout)


def close_adapter(adapter: object) -> None:
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
