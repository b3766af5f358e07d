"""How a command line names its target (issue 17): the synthetic SQLite target
(``runner.io.synthetic_target``), the HTTP target (:mod:`runner.io.targets.http`), its
wire protocol and failure classification (:mod:`runner.io.targets.protocol`), the
reference server (:mod:`runner.io.targets.server`) and a user's own adapter loaded by
``--target-adapter module:factory`` (:func:`load_factory`).

:func:`open_adapter` is where a command line's ``--target`` becomes an adapter: an
``http://`` or ``https://`` URL is the HTTP target, anything else the synthetic target's
file, unless ``--target-adapter`` names a factory, which is then given the ``--target``
text as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.errors import UsageError
from runner.leads.port import CRMAdapter

#: the environment variable the HTTP target's bearer token is read from
TOKEN_ENV = "RUNNER_TARGET_TOKEN"  # noqa: S105 - the variable's name, not a secret
#: the largest token file read
MAX_TOKEN_BYTES = 4096


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


@dataclass(frozen=True)
class TargetOptions:
    """How a command line's target is built (``--target`` and its companions)."""

    target: str | None
    adapter: str | None = None  # --target-adapter module:factory
    token: bytes | None = field(default=None, repr=False)
    read_timeout: float = 10.0


def read_token(path: str | None, env: dict[str, str] | None = None) -> bytes | None:
    """The bearer token: from ``path``, else ``$RUNNER_TARGET_TOKEN``, else None.  Never
    echoed in an error."""
    import os

    if path is not None:
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"cannot read the target token file {path!r}: "
                             f"{exc.strerror or exc}") from None
        if len(data) > MAX_TOKEN_BYTES:
            raise UsageError(f"the target token file {path!r} is larger than "
                             f"{MAX_TOKEN_BYTES} bytes")
    else:
        text = (env if env is not None else os.environ).get(TOKEN_ENV)
        if text is None:
            return None
        data = text.encode("utf-8", errors="surrogateescape")
    value = data.strip()
    if not value:
        raise UsageError("the target token is empty")
    if any(b < 0x21 or b > 0x7e for b in value):
        raise UsageError("the target token must be printable ASCII without spaces")
    return value


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
    if is_url(options.target):
        from runner.io.targets.http import HttpTarget, Timeouts

        return HttpTarget(options.target, token=options.token,
                          timeouts=Timeouts(read=options.read_timeout))
    from runner.io.synthetic_target import SyntheticTarget

    return SyntheticTarget(options.target)


def close_adapter(adapter: object) -> None:
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
