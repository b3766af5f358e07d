"""The reference parts generated from the code (``docs/hooks.py`` replaces their
placeholders): ``cli-commands`` and ``cli COMMAND`` from the argparse parsers (a build
fails if a command has no section: :func:`check_cli_sections`), ``exit-codes``,
``crash-points``, the transition tables, ``outbox-kinds`` (from the SQLite schema's
triggers), ``api DOTTED.NAME``, ``include FILE``, and the SPIN model's
``model-properties`` and ``model-steps``."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from mkdocs.exceptions import PluginError

from docs.gen.common import ROOT, cell

#: command paths that have a ``cli`` section, collected while pages are built
_seen_commands: set[tuple[str, ...]] = set()


# -- the CLI ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    os.environ["COLUMNS"] = "88"  # argparse wraps usage to the terminal's width
    from runner.cli import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _commands() -> dict[tuple[str, ...], tuple[str, argparse.ArgumentParser]]:
    """Every runnable command path (``("candidate", "add")``), with its help and parser."""
    found: dict[tuple[str, ...], tuple[str, argparse.ArgumentParser]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = list(_subcommands(parser))
        if not subs and path:
            return
        for name, text, sub in subs:
            if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                walk(sub, (*path, name))
            else:
                found[(*path, name)] = (text, sub)

    walk(_parser(), ())
    return found


def _option_row(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs != 0 and (action.metavar or not action.choices):
            name += f" `{action.metavar or action.dest.upper()}`"
    else:
        name = f"`{action.metavar or action.dest.upper()}`"
    notes = []
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    default = action.default
    said = "default" in (action.help or "")
    if default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0 and not said:
        notes.append(f"default `{default}`")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        notes.append("repeatable")
    required = "yes" if action.required or not action.option_strings else ""
    text = action.help or ""
    if notes:
        text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
    return f"| {name} | {required} | {cell(text)} |"


def _group_notes(parser: argparse.ArgumentParser) -> list[str]:
    notes = []
    for group in parser._mutually_exclusive_groups:
        names = " / ".join(f"`{a.option_strings[0]}`" for a in group._group_actions)
        notes.append(f"{'Exactly one' if group.required else 'At most one'} of {names}.")
    return notes


def render_cli(arg: str) -> str:
    path = tuple(arg.split())
    commands = _commands()
    if path not in commands:
        raise PluginError(f"gen:cli: no command {' '.join(path)!r}")
    _seen_commands.add(path)
    text, parser = commands[path]
    rows = [_option_row(a) for a in parser._actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
    lines = parser.format_usage().removeprefix("usage: ").rstrip().splitlines()
    usage = "\n".join([lines[0], *(line[len("usage: "):] for line in lines[1:])])
    out = [f"*{text}*" if text else "", "", "```text", usage, "```", "",
           "| option | required | meaning |", "|---|---|---|", *rows]
    notes = _group_notes(parser)
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def render_cli_commands(_: str) -> str:
    rows = ["| command | what it does |", "|---|---|"]
    for path, (text, _) in _commands().items():
        anchor = "-".join(path)
        rows.append(f"| [`runner {' '.join(path)}`](#{anchor}) | {cell(text)} |")
    return "\n".join(rows)


def check_cli_sections() -> None:
    """After a build: every command has a ``cli`` section (a partial build, ``mkdocs
    serve`` of one page, checks nothing)."""
    if not _seen_commands:
        return  # a partial build (mkdocs serve of one page) checks nothing
    missing = set(_commands()) - _seen_commands
    if missing:
        names = ", ".join(" ".join(p) for p in sorted(missing))
        raise PluginError(f"the CLI reference has no section for: {names}")


# -- exit codes, crash points, states, outbox ------------------------------------------


def render_exit_codes(_: str) -> str:
    import inspect

    from runner import errors

    described: dict[str, str] = {}
    last = ""
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^[\s│├└─]*(\w+)\s+(\d+)\s+(.*)$", line)
        if match:
            last = match.group(1)
            described[last] = match.group(3).strip()
        elif last and re.match(r"^[\s│]*\s{10,}\S", line):
            described[last] += " " + line.strip(" │")
        else:
            last = ""
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.RunnerError)
               and c is not errors.RunnerError]
    rows = ["| exit | error class | `reason` | meaning |", "|---|---|---|---|"]
    for cls in sorted(classes, key=lambda c: c.exit_code):  # stable: definition order
        base = cls.__mro__[1].__name__
        name = f"`{cls.__name__}`" + (f" (a `{base}`)" if base != "RunnerError" else "")
        param = inspect.signature(cls.__init__).parameters.get("reason")
        reason = f"`{cls.reason}`"
        if param is not None:  # set per error: the default, and others by input
            reason = f"`{param.default}` or a more precise one"
        rows.append(f"| {cls.exit_code} | {name} | {reason} | "
                    f"{cell(described.get(cls.__name__, ''))} |")
    return "\n".join(rows)


def render_crash_points(_: str) -> str:
    from runner.crashpoints import POINTS

    rows = ["| point | where the process dies |", "|---|---|"]
    rows += [f"| `{point}` | {cell(where)} |" for point, where in POINTS.items()]
    return "\n".join(rows)


def _transition_table(transitions: Any) -> str:
    rows = ["| from | may move to |", "|---|---|"]
    for src, targets in transitions.items():
        to = ", ".join(f"`{t.value}`" for t in sorted(targets)) or "nothing (terminal)"
        rows.append(f"| `{src.value}` | {to} |")
    return "\n".join(rows)


def render_lead_transitions(_: str) -> str:
    from runner.leads.states import TRANSITIONS

    return _transition_table(TRANSITIONS)


def render_candidate_transitions(_: str) -> str:
    from runner.candidates.states import TRANSITIONS

    return _transition_table(TRANSITIONS)


def _split_top(args: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in args:
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += char == "("
        depth -= char == ")"
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _outbox_events() -> list[tuple[str, str, list[str], str]]:
    """(kind, subject, payload keys, trigger) for every outbox INSERT in the SQLite schema."""
    found = []
    pattern = re.compile(
        r"CREATE TRIGGER (\w+)[^;]*?INSERT INTO outbox \(kind, subject, payload, at\)\s*"
        r"VALUES \('(\w+)', ([^,]+),\s*json_object\(", re.S)
    sources = (ROOT / "runner" / "io" / "sqlite").glob("*.py")
    for source in sorted(sources, key=lambda p: (p.name != "schema.py", p.name)):
        text = source.read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            depth, end = 1, match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            args = _split_top(text[match.end():end - 1])
            keys = [a.strip("'") for a in args[0::2]]
            subject = match.group(3).strip()
            subject = "the lead's `source_lead_id`" if "source_lead_id" in subject else (
                "the candidate's `id`" if subject == "NEW.id" else "none")
            found.append((match.group(2), subject, keys, match.group(1)))
    if not found:
        raise PluginError("gen:outbox-kinds: no outbox triggers found in the SQLite schema")
    return found


def render_outbox_kinds(_: str) -> str:
    rows = ["| kind | subject | payload keys | written by trigger |", "|---|---|---|---|"]
    for kind, subject, keys, trigger in _outbox_events():
        rows.append(f"| `{kind}` | {subject} | {', '.join(f'`{k}`' for k in keys)} | "
                    f"`{trigger}` |")
    return "\n".join(rows)


# -- the API, included files -------------------------------------------------------------


def _doc(obj: Any) -> str:
    import inspect

    text = inspect.getdoc(obj) or ""
    return text.replace("``", "`")


def _sig(obj: Any) -> str:
    import inspect

    text = str(inspect.signature(obj)).replace("'", "")
    return text.replace("(self, ", "(").replace("(self)", "()")


def render_api(arg: str) -> str:
    """A class or function of the public API: signature, docstring, public methods."""
    import importlib
    import inspect

    module_name, _, name = arg.rpartition(".")
    obj = getattr(importlib.import_module(module_name), name)
    out = []
    if inspect.isclass(obj):
        try:
            sig = _sig(obj)
        except (TypeError, ValueError):
            sig = ""
        out += [f"```python\nclass {name}{sig}\n```", "", _doc(obj), ""]
        for attr, member in vars(obj).items():
            if attr.startswith("_") and attr not in ("__aenter__",):
                continue
            if isinstance(member, property):
                out += [f"* **`{attr}`** (property){': ' + _doc(member) if _doc(member) else ''}",
                        ""]
                continue
            func = getattr(member, "__func__", member)
            if not callable(func) or isinstance(func, type):
                continue
            prefix = "async " if inspect.iscoroutinefunction(func) else ""
            if inspect.isasyncgenfunction(getattr(func, "__wrapped__", None)):
                prefix = "async with "
            out += [f"* **`{prefix}{attr}{_sig(func)}`**", ""]
            if _doc(func):
                out += ["    " + _doc(func).replace("\n", "\n    "), ""]
    else:
        out += [f"```python\n{name}{_sig(obj)}\n```", "", _doc(obj)]
    return "\n".join(out)


def render_include(arg: str) -> str:
    text = (ROOT / arg).read_text(encoding="utf-8")
    # the file's own title is the page's; links into docs/ become site links
    text = re.sub(r"^# .*\n", "", text, count=1)
    return text.replace("](docs/", "](")


# -- the SPIN model of the delivery protocol ---------------------------------------------


def _model_check() -> Any:
    """``model/check.py`` (not an installed package: MkDocs may have dropped the
    repository from ``sys.path`` again after loading this hook)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from model import check

    return check


def _formula(text: str, macros: dict[str, str]) -> str:
    """``[] FORALL(P)`` -> ``[] ∀i: (P's body)``, with the logical signs for ``&& || !``
    (a ``|`` would split a table cell)."""
    text = re.sub(r"FORALL\((\w+)\)", lambda m: f"∀i: {macros[m.group(1)]}", text)
    text = text.replace("||", "\N{LOGICAL OR}").replace("&&", "\N{LOGICAL AND}")
    return re.sub(r"!(?!=)", "\N{NOT SIGN}", text)


def render_model_properties(_: str) -> str:
    check = _model_check()
    formulas, macros = check.ltl_formulas(), check.property_macros()
    if set(formulas) != set(check.PROPERTIES):
        raise PluginError("gen:model-properties: model/delivery.pml and model/check.py "
                          "name different properties")
    rows = ["| property | the guarantee it checks | formula (LTL) |", "|---|---|---|"]
    rows += [f"| `{name}` | {cell(check.GUARANTEES[name])} | "
             f"`{cell(_formula(formulas[name], macros))}` |" for name in check.PROPERTIES]
    return "\n".join(rows)


def render_model_steps(_: str) -> str:
    check = _model_check()
    rows = ["| model step | where in the model | code | crash points | status |",
            "|---|---|---|---|---|"]
    for step in check.load_steps():
        code = ", ".join(f"`{c}`" for c in step["code"]) or "none yet"
        points = ", ".join(f"`{p}`" for p in step["crash_points"]) or "-"
        status = "on main" if step["status"] == "main" else f"**{step['status']}**"
        rows.append(f"| {cell(step['step'])} | {cell(step['model'])} | {code} | {points} "
                    f"| {status} |")
    return "\n".join(rows)
