"""A configuration file: ``--config runner.toml`` (stdlib ``tomllib``), issue 19.

The keys are the long flags without their dashes (``interval``, ``poll-limit`` or
``poll_limit``), at the top level for every command that has the flag, or in a table named
after a command (``[start]``) for that command alone; a table's key wins over a top-level
one.  A flag on the command line wins over both.  A value goes through the flag's own
parser, so it is checked exactly as the flag is; a key no command has is refused by name.

The file is applied by adding its values to the command line before argparse reads it:
one code path parses flags and file alike.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.errors import UsageError

FLAG = "--config"


@dataclass
class Applied:
    """A command line with a file's values added, and where each option came from."""

    argv: list[str]
    path: str | None = None
    #: option dest -> "flag" or "file"; options not named here have their default
    sources: dict[str, str] = field(default_factory=dict)


def split_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``--config PATH`` (or ``--config=PATH``) taken out of ``argv`` wherever it stands."""
    path: str | None = None
    rest: list[str] = []
    items = iter(argv)
    for arg in items:
        if arg == "--":
            rest.append(arg)
            rest.extend(items)
            break
        if arg == FLAG or arg.startswith(FLAG + "="):
            if path is not None:
                raise UsageError("--config is given twice")
            value = arg[len(FLAG) + 1:] if "=" in arg else next(items, None)
            if not value:
                raise UsageError("--config needs a file: --config runner.toml")
            path = value
        else:
            rest.append(arg)
    return path, rest


def read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read the configuration file {path}: "
                         f"{exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None


def apply(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Applied:
    """``argv`` with the values of its ``--config`` file added (``argv`` itself, less the
    flag, when there is none).  ``parser`` is the full parser (every command)."""
    path, rest = split_flag(argv)
    applied = Applied(rest, path)
    command, words = leaf(parser, rest)
    given = _given(command, rest[words:]) if command is not None else set()
    applied.sources.update(dict.fromkeys(given, "flag"))
    if path is None:
        return applied
    values = _values_for(parser, read(path), path, rest[0] if rest else None)
    if command is None:
        return applied
    known = options(command)
    added: list[str] = []
    for key, (spelled, value) in values.items():
        action = known.get(key)
        if action is None or action.dest in given:
            continue  # another command's flag, or given on the command line
        added.extend(_as_args(action, value, spelled, path))
        applied.sources[action.dest] = "file"
    applied.argv = [*rest, *added] if "--" not in rest else _before_dashes(rest, added)
    return applied


def _before_dashes(rest: list[str], added: list[str]) -> list[str]:
    at = rest.index("--")
    return [*rest[:at], *added, *rest[at:]]


def _values_for(
    parser: argparse.ArgumentParser, data: Mapping[str, Any], path: str, command: str | None
) -> dict[str, tuple[str, Any]]:
    """The file's keys for ``command`` (top level, then its table), every key checked:
    by flag name (``poll-limit``), each with its spelling in the file and its value."""
    commands = _commands(parser)
    known = {key for sub in _leaves(parser) for key in options(sub)}
    unknown: list[str] = []
    top: dict[str, tuple[str, Any]] = {}
    tables: dict[str, dict[str, tuple[str, Any]]] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key in commands:
            tables[key] = {_key(k): (k, v) for k, v in value.items()}
            unknown.extend(f"[{key}] {k}" for k in value if _key(k) not in known)
        elif isinstance(value, dict):
            unknown.append(f"[{key}]")
        elif _key(key) in known:
            top[_key(key)] = (key, value)
        else:
            unknown.append(key)
    if unknown:
        raise UsageError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''}: "
                         f"{', '.join(unknown)} (keys are the long flags without '--', such "
                         "as db or interval; a table is a command's name, such as [start])")
    return top | (tables.get(command, {}) if command else {})


def _key(name: str) -> str:
    return name.replace("_", "-")


def _as_args(action: argparse.Action, value: Any, key: str, path: str) -> list[str]:
    """The flag's words for a file's value (``key`` as the file spells it)."""
    where = f"{path}: {key}"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: takes true or false, not {value!r}")
        on = value if isinstance(action, argparse._StoreTrueAction) else not value
        return [action.option_strings[-1]] if on else []
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not isinstance(action, argparse._AppendAction):
        raise UsageError(f"{where}: takes one value, not a list")
    args: list[str] = []
    for item in items:
        if isinstance(item, bool | dict | list) or item is None:
            raise UsageError(f"{where}: {item!r} is not a value for {action.option_strings[-1]}")
        text = str(item)
        _check(action, text, where)
        args.extend([action.option_strings[-1], text])
    return args


def _check(action: argparse.Action, text: str, where: str) -> None:
    """The value through the flag's own type and choices (the same words as a flag's)."""
    try:
        parsed = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UsageError(f"{where}: {exc}") from None
    if action.choices is not None and parsed not in action.choices:
        raise UsageError(f"{where}: {text!r} is not one of "
                         f"{', '.join(map(str, action.choices))}")


def _subparsers(parser: argparse.ArgumentParser) -> Mapping[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    return set(_subparsers(parser))


def _leaves(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    subs = _subparsers(parser)
    if not subs:
        yield parser
    for sub in subs.values():
        yield from _leaves(sub)


def leaf(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.ArgumentParser | None, int]:
    """The (sub)parser that reads ``argv``'s options, and how many command words lead."""
    words = 0
    while subs := _subparsers(parser):
        if words >= len(argv) or argv[words] not in subs:
            return None, words
        parser = subs[argv[words]]
        words += 1
    return parser, words


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's long options by key (``poll-limit``), help and version left out."""
    return {option[2:]: action for action in parser._actions
            for option in action.option_strings
            if option.startswith("--") and action.dest not in ("help", "version")}


def _given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options ``argv`` names (exactly, or as ``--opt=value``)."""
    strings = {s: a.dest for a in parser._actions for s in a.option_strings}
    given: set[str] = set()
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name in strings:
            given.add(strings[name])
    return given
