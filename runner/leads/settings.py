"""What a command line tells a target adapter's factory (issue 29): :class:`TargetSettings`.

Why a type of its own: ``--target-token-file``, ``--target-timeout`` and the repeated
``--target-option KEY=VALUE`` (or a config file's ``[target]`` table) must reach a user's
``--target-adapter`` factory, and nothing given may be silently dropped.  A factory that
has a parameter named ``settings`` is called ``factory(target, settings=TargetSettings(…))``;
one without it is called ``factory(target)`` as before, and is refused when the command
line gives any of them (``runner.io.targets.compose``).

The settings may hold secrets (the token; an option's value), so their ``repr`` shows
neither: it says whether a token is set and which option keys there are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: an option key: a letter or '_', then letters, digits, '_' or '-' (at most 64 in all)
OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def check_option_key(key: str) -> str:
    """``key`` if it is a plain option key (:data:`OPTION_KEY`), else ValueError."""
    if not OPTION_KEY.fullmatch(key):
        shown = key if len(key) <= 40 else key[:40] + "…"
        raise ValueError(f"{shown!r} is not an option key (a letter or '_', then letters, "
                         "digits, '_' or '-'; at most 64)")
    return key


def _frozen(options: Mapping[str, str]) -> Mapping[str, str]:
    for key, value in options.items():
        check_option_key(key)
        if not isinstance(value, str):
            raise TypeError(f"option {key}: the value must be a string, "
                            f"not {type(value).__name__}")
    return MappingProxyType(dict(options))


@dataclass(frozen=True)
class TargetSettings:
    """What runner's command line gives a ``--target-adapter`` factory besides ``--target``.

    * ``token``: the bytes of ``--target-token-file`` (surrounding whitespace stripped),
      else of ``$RUNNER_TARGET_TOKEN``, else None.  Never logged, never in ``repr``.
    * ``timeout``: ``--target-timeout`` in seconds, or None when it was not given: the
      adapter then uses its own default.
    * ``options``: every ``--target-option KEY=VALUE`` (and the config file's
      ``[target] options`` table), each key a letter or ``_`` then letters, digits,
      ``_`` or ``-`` (at most 64), each value a string as given; read-only.  Checking
      them (a missing or an unknown key) is the factory's job; a factory that raises
      stops the command with one clear line (exit 2).
    """

    token: bytes | None = field(default=None, repr=False)
    timeout: float | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _frozen(self.options))

    def __repr__(self) -> str:
        return (f"TargetSettings(token={'<set>' if self.token is not None else None}, "
                f"timeout={self.timeout!r}, options={sorted(self.options)!r})")

    def __hash__(self) -> int:
        return hash((self.token, self.timeout, tuple(sorted(self.options.items()))))
