"""A configuration file: ``--config runner.toml`` (stdlib ``tomllib``), issue 19.

The keys are the long flags without their dashes (``interval``, ``poll-limit`` or
``poll_limit``), at the top level for every command that has the flag, or in a table named
after a command (``[start]``) for that command alone; a table's key wins over a top-level
one.  A flag on the command line wins over both.  A value goes through the flag's own
parser, so it is checked exactly as the flag is; a key no command has is refused by name.

The file is applied by adding its values to the command line before argparse reads it:
one code path parses flags and file alike.

A ``[target]`` table (at the top level, or in a command's table) groups the target's
flags: its key ``K`` is the flag ``--target-K`` (``adapter``, ``token-file``, ``timeout``,
``rate`` …), ``location`` is ``--target`` itself, and ``options`` is a table of
``--target-option KEY=VALUE``, values strings.  A command line's ``--target-option`` wins
key by key: the file's other options still apply (:data:`KEYED`).
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.errors import UsageError

FLAG = "--config"
#: the table of the target's flags, and its two keys that are not ``target-K``
TARGET_TABLE = "target"
TARGET_KEYS = {"location": "target", "options": "target-option"}
#: an argparse action with this attribute true takes ``KEY=VALUE`` values, and a file's
#: values join the command line's key by key (``--target-option``): a key on the command
#: line wins, the file's other keys still apply
KEYED = "keyed"


@dataclass
class Applied:
    """A command line with a file's values added, and where each option came from."""

    argv: list[str]
    path: str | None = None
    #: option dest -> "flag", "file", or "flag and file" (a keyed option's keys from
    #: both); options not named here have their default
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
        if action is None:
            continue  # another command's flag
        source = "file"
        if action.dest in given:
            if not getattr(action, KEYED, False):
                continue  # given on the command line
            value = _keys_not_given(action, value, rest[words:])
            if not value:
                continue
            source = "flag and file"
        added.extend(_as_args(action, value, spelled, path))
        applied.sources[action.dest] = source
    applied.argv = [*rest, *added] if "--" not in rest else _before_dashes(rest, added)
    return applied


def _keys_not_given(action: argparse.Action, value: Any, argv: Sequence[str]) -> list[Any]:
    """A keyed option's file values (``KEY=VALUE``) whose keys ``argv`` does not give."""
    given: set[str] = set()
    items = iter(argv)
    for arg in items:
        if arg == "--":
            break
        for option in action.option_strings:
            if arg == option:
                given.add(str(next(items, "")).partition("=")[0])
            elif arg.startswith(option + "="):
                given.add(arg[len(option) + 1:].partition("=")[0])
    values = value if isinstance(value, list) else [value]
    return [v for v in values if not (isinstance(v, str) and v.partition("=")[0] in given)]


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
    for key, spelled, value in _entries(data, path, ""):
        if isinstance(value, dict) and spelled in commands:
            entries = _entries(value, path, f"[{spelled}] ")
            tables[spelled] = {k: (name, v) for k, name, v in entries}
            unknown.extend(f"[{spelled}] {name}" for k, name, _ in entries if k not in known)
        elif isinstance(value, dict):
            unknown.append(f"[{spelled}]")
        elif key in known:
            top[key] = (spelled, value)
        else:
            unknown.append(spelled)
    if unknown:
        raise UsageError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''}: "
                         f"{', '.join(unknown)} (keys are the long flags without '--', such "
                         "as db or interval; a table is a command's name, such as [start], "
                         "or [target])")
    return top | (tables.get(command, {}) if command else {})


def _key(name: str) -> str:
    return name.replace("_", "-")


def _entries(data: Mapping[str, Any], path: str, where: str) -> list[tuple[str, str, Any]]:
    """A table's keys as ``(flag key, spelling in the file, value)``, its ``[target]``
    table spread into flag keys; two spellings of one flag are refused (neither is
    dropped)."""
    found: list[tuple[str, str, Any]] = []
    for name, value in data.items():
        if name == TARGET_TABLE and isinstance(value, dict):
            found.extend(_target_entries(value, path, where))
        else:
            found.append((_key(name), name, value))
    first: dict[str, str] = {}
    for key, spelled, _ in found:
        if key in first:
            raise UsageError(f"{path}: {where}{first[key]} and {spelled} name one flag "
                             f"(--{key}); keep one")
        first[key] = spelled
    return found


def _target_entries(table: Mapping[str, Any], path: str,
                    where: str) -> list[tuple[str, str, Any]]:
    """``[target]``: ``K`` is ``target-K``, ``location`` is ``target``, and ``options`` a
    table of ``target-option`` values (``KEY=VALUE``)."""
    found: list[tuple[str, str, Any]] = []
    for name, value in table.items():
        key = TARGET_KEYS.get(_key(name), f"{TARGET_TABLE}-{_key(name)}")
        spelled = f"{TARGET_TABLE}.{name}"
        if key == "target-option" and isinstance(value, dict):
            value = [_option_item(k, v, f"{path}: {where}{spelled}") for k, v in value.items()]
        found.append((key, spelled, value))
    return found


def _option_item(key: str, value: Any, where: str) -> str:
    """One entry of ``[target] options`` as ``--target-option``'s ``KEY=VALUE`` (the key
    is checked by the flag's own parser); a value that is not a string is refused
    without showing it (it may be a secret)."""
    if not isinstance(value, str):
        raise UsageError(f"{where}.{key}: an option's value is a string; write it in "
                         "quotes")
    return f"{key}={value}"


def _as_args(action: argparse.Action, value: Any, key: str, path: str) -> list[str]:
    """The flag's words for a file's value (``key`` as the file spells it)."""
    where = f"{path}: {key}"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: takes true or false, not {value!r}")
        on = value if isinstance(action, argparse._StoreTrueAction) else not value
        return [action.option_strings[-1]] if on else []
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not (isinstance(action, argparse._AppendAction)
                                        or getattr(action, KEYED, False)):
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
