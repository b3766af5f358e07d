"""MkDocs hook: the parts of the documentation that are generated at build time.

Why: a reference typed by hand drifts from the code, and a figure typed by hand drifts
from the measurement.  A page holds a placeholder, ``<!-- gen:NAME -->`` or
``<!-- gen:NAME ARG -->``, and this hook replaces it while the site is built:

* ``cli-commands``, ``cli COMMAND [SUBCOMMAND]``: from the argparse parsers
  (``runner.cli.build_parser``); the build fails if a command has no section;
* ``exit-codes``: from the error classes of ``runner/errors.py``;
* ``crash-points``: from ``runner/crashpoints.py``;
* ``lead-transitions``, ``candidate-transitions``: from the transition tables;
* ``outbox-kinds``: from the SQLite schema's outbox triggers;
* ``results KIND``: the latest machine-written results file ``bench/results/KIND-*.json``
  (``bench``, ``batch``, ``chaos``, ``pg-target`` …);
* ``api DOTTED.NAME``: a class's signature, docstring and public methods;
* ``include FILE``: a file of the repository (the changelog);
* ``model-properties``, ``model-steps``: the SPIN model's named properties (from
  ``model/delivery.pml``) and its model-to-code table (``model/steps.toml``).

An unknown placeholder fails the build (``mkdocs build --strict`` fails on any error).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PLACEHOLDER = re.compile(r"<!-- gen:([\w-]+)(?: ([^>]*?))? -->")

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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


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
    return f"| {name} | {required} | {_cell(text)} |"


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
        rows.append(f"| [`runner {' '.join(path)}`](#{anchor}) | {_cell(text)} |")
    return "\n".join(rows)


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
                    f"{_cell(described.get(cls.__name__, ''))} |")
    return "\n".join(rows)


def render_crash_points(_: str) -> str:
    from runner.crashpoints import POINTS

    rows = ["| point | where the process dies |", "|---|---|"]
    rows += [f"| `{point}` | {_cell(where)} |" for point, where in POINTS.items()]
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


# -- measured figures ------------------------------------------------------------------


def _num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _provenance(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = ", ".join(str(x) for x in m.get("load_average", []))
    return (f"Measured {doc['date']} by `{doc['command']}` on {m['cpus']} CPUs "
            f"({m['cpu_model'] or 'unknown model'}), Python {m['python']}, SQLite "
            f"{m['sqlite']}; load average at the end {load}. Source: `{doc['file']}`.")


def _render_bench(doc: dict[str, Any]) -> str:
    rows = ["| benchmark | runner | baseline (same run) | ratio | target | met |",
            "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        digits = 1 if r["unit"] in ("ms", "MB peak") else 0
        base_digits = 1 if r["baseline_unit"] in ("ms",) else 0
        rows.append(f"| {r['name']} | {_num(r['figure'], digits)} {r['unit']} | "
                    f"{_num(r['baseline'], base_digits)} {r['baseline_unit']} | "
                    f"{r['ratio']:.2f} | {_cell(r['target'])} | "
                    f"{'yes' if r['met'] else '**no**'} |")
    notes = [f"* **{r['name']}**: {_cell(r['note'])}" for r in doc["rows"] if r["note"]]
    return "\n".join([_provenance(doc) + f" Wall time {doc['seconds']} s.", "", *rows, "",
                      "What each baseline is, as the run printed it:", "", *notes])


def _render_batch(doc: dict[str, Any]) -> str:
    rows = ["| store | --batch-size | dispatch | with process start-up | "
            "disk, single-row commits | ratio |", "|---|---|---|---|---|---|"]
    stores = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    rows += [f"| {stores[r.get('backend', 'sqlite')]} | {r['batch_size']} | "
             f"{_num(r['dispatch_per_s'], 0)} /s | "
             f"{_num(r['with_startup_per_s'], 0)} /s | {_num(r['disk_commits_per_s'], 0)} /s | "
             f"{r['ratio']:.2f} |" for r in doc["rows"]]
    return "\n".join([_provenance(doc) + f" {doc['n']:,} records per run, median of "
                      f"{doc['rounds']} interleaved rounds.", "", *rows])


def _render_rates(doc: dict[str, Any], what: str) -> str:
    """A peer comparison (``ingest``, ``peers``): rates, then the ratios with their goals."""
    rows = ["| contender | rows/s |", "|---|---|"]
    rows += [f"| {_cell(name)} | {_num(rate)} |" for name, rate in doc["rates"].items()]
    rows += ["", "| ratio | value | goal | met |", "|---|---|---|---|"]
    for name, value in doc["ratios"].items():
        goal = doc["goals"].get(name)
        shown = "n/a" if value is None else f"{value:.2f}"
        met = "" if goal is None or value is None else ("yes" if value >= goal else "no")
        rows.append(f"| {_cell(name)} | {shown} | {'' if goal is None else f'>= {goal}'} | "
                    f"{met} |")
    skipped = "".join(f" Skipped: {_cell(note)}." for note in doc.get("skipped", []))
    return "\n".join([_provenance(doc) + f" {doc['n']:,} events {what}, median of "
                      f"{doc['rounds']} interleaved round(s).{skipped}", "", *rows])


def _render_logcost(doc: dict[str, Any]) -> str:
    """The dispatch path's log lines: each logged run's own share of its dispatch time,
    beside the ratio of logged to quiet runs (two runs, so noisier)."""
    rows = ["| store, batch size | time spent logging (inside the logged run) | "
            "logged / quiet (two runs) |", "|---|---|---|"]
    for name, share in doc["handler_share"].items():
        ratio = doc["ratios"].get(f"{name}: logged / quiet")
        rows.append(f"| {_cell(name)} | {share * 100:.1f}% | "
                    f"{'n/a' if ratio is None else f'{ratio:.2f}'} |")
    skipped = "".join(f" Skipped: {_cell(note)}." for note in doc.get("skipped", []))
    return "\n".join([_provenance(doc) + f" {doc['n']:,} events per run (a fifth at batch "
                      f"size 1), median of {doc['rounds']} interleaved rounds.{skipped}",
                      "", *rows])


def _render_reconcile(doc: dict[str, Any]) -> str:
    """``python -m bench reconcile``: the cost of a cycle over many uncertain records, one
    record per request and in chunks, and delivery under a request quota."""
    cost = ["| backend | reads per request | target requests | cycle time | at "
            f"{doc['quota_per_min']} requests/min |", "|---|---|---|---|---|"]
    for c in doc["costs"]:
        for r in c["rows"]:
            cost.append(f"| {c['backend']} | {r['batch_size']} | {_num(r['requests'])} | "
                        f"{r['seconds']:,.2f} s | {r['quota_minutes']:,.1f} min |")
        cost.append(f"| {c['backend']} | before / after | **{c['request_ratio']:g}x** fewer "
                    f"| **{c['time_ratio']:g}x** less | |")
    if "write_quota_per_min" not in doc["quota"][0]:  # before the separate read quota
        quota = ["| --batch-size | leads confirmed per minute | target requests per minute "
                 "| answered rate limited | lost | duplicated |", "|---|---|---|---|---|---|"]
        quota += [f"| {q['batch_size']} | {_num(q['leads_per_min'])} | "
                  f"{q['requests_per_min']:g} | {q['refused_in_window']} | {q['lost']} | "
                  f"{q['duplicated']} |" for q in doc["quota"]]
        about = (f"Delivery at {doc['quota_per_min']} requests a minute (every request a "
                 "token: a batch write and its readback), one write in ten answered rate "
                 "limited (retry-after 2 s)")
    else:
        quota = ["| --batch-size | writes answered rate limited | read quota | leads "
                 "confirmed per minute | writes per minute | reads per minute | answered "
                 "rate limited | lost | duplicated |", "|---|---|---|---|---|---|---|---|---|"]
        quota += [f"| {q['batch_size']} | "
                  + (f"{q['refuse_share']:.0%} (retry-after 2 s)" if q["refuse_share"]
                     else "none") + " | "
                  + ("not paced" if q["read_quota_per_min"] is None
                     else f"{q['read_quota_per_min']}/min")
                  + f" | **{_num(q['leads_per_min'])}** | {q['writes_per_min']:g} | "
                  f"{q['reads_per_min']:g} | {q['refused_in_window']} | {q['lost']} | "
                  f"{q['duplicated']} |" for q in doc["quota"]]
        about = (f"Delivery at {doc['quota_per_min']} writes a minute (`--target-rate "
                 f"{doc['quota_per_min']}/min`: every batch write a token; reads not paced, "
                 "or on a read quota of their own, `--target-read-rate`)")
    return "\n".join([
        _provenance(doc) + f" A cycle over {doc['uncertain']:,} uncertain records, median of "
        f"{doc['rounds']} alternating rounds:", "", *cost, "",
        f"{about}, over a {doc['window_s']:g} s window; then every record delivered and "
        "the target's rows counted:", "", *quota])


def _render_sweep_explain(doc: dict[str, Any]) -> str:
    rows = ["| step | time | ratio |", "|---|---|---|"]
    rows += [f"| {_cell(s['step'])} | {s['ms']:,.1f} ms | {s['ratio']:.1f} |"
             for s in doc["steps"]]
    return "\n".join([_provenance(doc) + f" {doc['n']:,} candidates, median of "
                      f"{doc['repeat']} fresh run(s).", "", *rows])


def _render_pipeline(doc: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in doc.get("versions", {}).items())
    rows = ["| backend | workers | runner, no-op claim + complete | baseline, same run | "
            "baseline | ratio |", "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        mine = f"{_num(r['runner']['per_s'])} /s" if r["runner"] else "n/a"
        other = f"{_num(r['other']['per_s'])} /s" if r["other"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "n/a"
        rows.append(f"| {r['backend']} | {r['workers']} | {mine} | {_cell(r['baseline'])} | "
                    f"{other} | {ratio} |")
    return "\n".join([_provenance(doc) + f" N = {doc['n']:,} inputs, runner batch "
                      f"{doc['batch']}; comparison packages: {versions}.", "", *rows])


def _render_chaos(doc: dict[str, Any]) -> str:
    verdict = "PASS" if doc["ok"] else "FAIL"
    rows = ["| crash point | runs dealt | fired | restart crashed too |", "|---|---|---|---|"]
    rows += [f"| `{p}` | {v['runs']} | {v['fired']} | {v['restart_crashed']} |"
             for p, v in doc["points"].items()]
    states = ", ".join(f"{k} {_num(v)}" for k, v in doc["end_states"].items())
    candidates = ", ".join(f"{k} {_num(v)}" for k, v in doc["candidates"].items())
    lines = [
        _provenance(doc), "",
        f"**{verdict}, {len(doc['violations'])} violations.** Backend {doc['backend']}, "
        f"{doc['runs']:,} runs (seed {doc['seed']}, {doc['jobs']} jobs, "
        f"{doc['seconds'] / 60:.1f} min): {doc['fired']:,} crashed at their dealt point, "
        f"{doc['not_reached']:,} never reached it, and {doc['restart_crashed']:,} restarts "
        f"crashed again at a second point.", "",
        f"* end states of {_num(doc['records'])} records: {states};",
        f"* {_num(doc['target_rows'])} target rows; "
        f"{_num(doc['recovered_by_readback'])} records recovered from uncertain by readback;",
        f"* candidates: {candidates}.", "", *rows]
    return "\n".join(lines)


def _render_chaos_http(doc: dict[str, Any]) -> str:
    """``bench/chaos.py --http-target``: the chaos table, and what the faulty servers did."""
    served = doc.get("served", {})
    faults = ", ".join(f"`{k}` {v}" for k, v in sorted(doc.get("faults", {}).items()))
    return "\n".join([
        _render_chaos(doc), "",
        f"Server faults switched on (episodes): {faults}. The faulty servers applied "
        f"{_num(served.get('appends', 0))} appends ({_num(served.get('rows', 0))} rows), "
        f"dropped the connection after applying {_num(served.get('dropped', 0))} of them, "
        f"and answered {_num(served.get('throttled', 0))} appends 429."])


def _render_kill9(doc: dict[str, Any]) -> str:
    verdict = "PASS" if doc["ok"] else "FAIL"
    t = doc["totals"]
    head = ["run", "leads", "kills", "confirmed", "uncertain", "recovered", "lost",
            "duplicated", "unexpected", "seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        rows.append("| " + " | ".join(str(r[c]) for c in head) + " |")
    rows.append("| **total** | " + " | ".join(f"**{t[c]}**" for c in head[1:]) + " |")
    return "\n".join([
        _provenance(doc), "",
        f"**{verdict}** (lost = duplicated = unexpected = 0 required). Backend "
        f"{doc['backend']}, {doc['runs']} runs of {doc['leads']:,} leads (seed {doc['seed']}, "
        f"kills within {doc['max_delay']:.2f} s of each start, {doc['seconds'] / 60:.1f} min): "
        f"{t['kills']} kills, {t['recovered']} records recovered by readback, "
        f"{t['uncertain']} left uncertain, {t['lost']} lost, {t['duplicated']} duplicated, "
        f"{t['unexpected']} unexpected.", "", *rows, *_kill9_faults(doc)])


def _render_kill9_settled(doc: dict[str, Any]) -> str:
    """A campaign that must end with nothing uncertain (issue 29): a deduplicating target
    with no operator command, or one ``resolve --all`` on a target that cannot."""
    verdict = "PASS" if doc["ok"] else "FAIL"
    t = doc["totals"]
    mode = doc.get("mode", {})
    how = ("one `runner resolve --all --as not-sent` per run, then one more run"
           if mode.get("settle") else "no operator command")
    head = ["run", "leads", "kills", "confirmed", "uncertain", "recovered", "requeued",
            "settled", "lost", "duplicated", "unexpected", "seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        rows.append("| " + " | ".join(str(r.get(c, 0)) for c in head) + " |")
    rows.append("| **total** | " + " | ".join(f"**{t.get(c, 0)}**" for c in head[1:]) + " |")
    return "\n".join([
        _provenance(doc), "",
        f"**{verdict}** (lost = duplicated = unexpected = uncertain = 0 required, with "
        f"{how}). Store {doc['backend']}, {doc['runs']} runs of {doc['leads']:,} leads at "
        f"the default batch (seed {doc['seed']}; each kill at a random moment within "
        f"{doc['max_delay']:.2f} s of the worker's first send; "
        f"{doc['seconds'] / 60:.1f} min): {t['kills']} kills, {t['recovered']} records "
        f"confirmed by readback, {t.get('requeued', 0)} sent again by runner itself "
        f"(E7), {t.get('settled', 0)} settled by the operator's command, "
        f"{t['uncertain']} left uncertain, {t['lost']} lost, {t['duplicated']} duplicated.",
        "", *rows, *_kill9_faults(doc)])


def _kill9_faults(doc: dict[str, Any]) -> list[str]:
    """The server faults of each run of an HTTP-target campaign (none otherwise)."""
    runs = [r for r in doc["results"] if r.get("faults")]
    if not runs:
        return []
    return ["", "The server's faults in each run (`KIND[:SECONDS]@PROBABILITY`):", "",
            *(f"* run {r['run']}: {', '.join(f'`{f}`' for f in r['faults'])}" for r in runs)]


def _render_soak(doc: dict[str, Any]) -> str:
    verdict = "PASS" if doc["ok"] else "FAIL"
    samples = doc["samples"]
    lives: dict[int, float] = {}
    for sample in samples:
        lives[sample["life"]] = max(lives.get(sample["life"], 0.0), sample["rss_mib"])
    c = doc["ceilings"]
    peak = " / ".join(f"{v:.0f}" for v in lives.values())
    head = (f"Measured from {doc['started_at']} by `python -m bench soak --minutes "
            f"{doc['minutes']:g} --backend {doc['backend']}` on {doc['machine']}. Source: "
            f"`{doc['file']}`.")
    # the worker's figures while it runs: from the first sample a minute in (a worker
    # just started has not loaded yet) to the last one before it was stopped
    live = [x for x in samples if x["rss_mib"] > 0] or samples
    warm = [x for x in live if x["t"] >= 60] or live

    def span(key: str, fmt: str) -> str:
        values = [x[key] for x in warm]
        return " / ".join(format(v, fmt) for v in (values[0], max(values), values[-1]))

    growth = doc.get("store_growth_kib_per_lead")
    per_lead = doc.get("store_kib_per_lead")
    rows = [
        "| figure (at 1 min / max / last sample while the worker ran) | value | ceiling |",
        "|---|---|---|",
        f"| RSS (MiB) | {span('rss_mib', '.0f')} | {c['rss_mib']:g} |",
        f"| peak RSS of each worker life (MiB) | {peak} | {c['rss_mib']:g} |",
        f"| open files | {span('open_files', 'd')} | {c['open_files']} |",
        f"| WAL (MiB) | {span('wal_mib', '.1f')} | {c['wal_mib']:g} |",
        f"| store (MiB) | {span('store_mib', '.1f')} | - |",
        f"| store at a third of the run / at the end (MiB) | {_store_path(samples)} | - |",
        f"| store per lead at the end (KiB) | "
        f"{'-' if per_lead is None else f'{per_lead:.2f}'} | - |",
    ]
    if "store_growth_kib_per_lead" in c:
        rows.append(f"| store growth per lead after the first third (KiB) | "
                    f"{'-' if growth is None else f'{growth:.2f}'} | "
                    f"{c['store_growth_kib_per_lead']:g} |")
    rows += [
        f"| outbox rows at the end (of {_num(doc['outbox_last_seq'])} written) | "
        f"{_num(doc['outbox_rows_at_end'])} | - |",
    ]
    if "pipeline_rows_at_end" in doc:
        removed = doc.get("pipeline_removed", {})
        rows.append(f"| pipeline rows at the end (records, work, histories) | "
                    f"{_num(doc['pipeline_rows_at_end'])} | - |")
        rows.append(f"| pipeline rows pruned ({doc.get('pipeline_prunes', 0)} prunes, "
                    f"`--before {doc.get('pipeline_keep', '')}`) | "
                    f"{_num(sum(removed.values()))} | - |")
    rows.append(f"| stderr (MiB a minute) | {doc['stderr_mib_per_min']:.3f} | - |")
    if doc.get("violations"):
        rows += ["", "Violations:", ""] + [f"* {_cell(v)}" for v in doc["violations"]]
    return "\n".join([
        head, "",
        f"**{verdict}.** {doc['minutes']:g} minutes on {doc['backend']}: {doc['rate']:g} leads/s "
        f"fed, {doc['churn']:g} status changes/s, kill -9 every {doc['kill_every']:g} s "
        f"({doc['kills']} kills). {_num(doc['accepted'])} accepted, "
        f"{_num(doc['confirmed'])} confirmed, {doc['uncertain']} uncertain, "
        f"**{doc['lost']} lost, {doc['duplicated']} duplicated, {doc['unexpected']} "
        f"unexpected**; {_num(doc['exported_events'])} events exported and "
        f"{_num(doc['pruned_events'])} pruned, {doc['export_gaps']} export gaps"
        + ("; `VACUUM` after each retention pass (the server's autovacuum is off)"
           if doc.get("pg_vacuum") else "") + ".", "",
        *rows])


def _store_path(samples: list[dict[str, Any]]) -> str:
    third = samples[-1]["t"] / 3
    mid = next((x for x in samples if x["t"] >= third), samples[-1])
    return f"{mid['store_mib']:.1f} / {samples[-1]['store_mib']:.1f}"


def _render_stop_moments(doc: dict[str, Any]) -> str:
    return (f"| {_cell(doc['label'])} | {doc['trials']} | {doc['write_locked']} "
            f"({doc['write_locked_fraction']:.0%}) | {doc['second_refused_within_5s']} | "
            f"{doc['second_median_seconds']:.1f} s | `{doc['file']}` |")


def _render_kill9_http(doc: dict[str, Any]) -> str:
    head = ["run", "leads", "kills", "answered", "retried", "lost", "twice", "duplicated",
            "wrong", "confirmed", "uncertain"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        rows.append("| " + " | ".join(str(r[c]) for c in head) + " |")
    t = doc["totals"]
    rows.append("| **total** | " + " | ".join(f"**{t[c]}**" for c in head[1:]) + " |")
    verdict = "PASS" if doc["ok"] else "FAIL"
    return "\n".join([
        _provenance(doc), "",
        f"**{verdict}** (lost = twice = duplicated = wrong = 0 required). Backend "
        f"{doc['backend']}, {doc['runs']} runs of {doc['leads']:,} leads (seed {doc['seed']}, "
        f"{doc['seconds'] / 60:.1f} min): {t['kills']} kills under load, {t['answered']} "
        f"answers, {t['lost']} lost, {t['twice']} answered twice, {t['duplicated']} "
        f"duplicated in the target.", "", *rows])


def _states(c: dict[str, Any]) -> str:
    text = _num(c["states_stored"]) if c["states_stored"] is not None else "?"
    if c.get("states_visited"):
        text += f" ({_num(c['states_visited'])} visited)"
    return text


def _render_spin(doc: dict[str, Any]) -> str:
    checks = doc["checks"]
    verified = [c for c in checks if c["mutation"] is None]
    mutated = [c for c in checks if c["mutation"] is not None]
    changes = {m["macro"]: m for m in doc["mutations"]}
    keys = ["N", "BATCH", "WORKERS", "MAXCRASH", "MAXFAULT", "MAXRESOLVE", "NETCAP"]
    configs = ["| bounds | what | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    configs += [f"| `{name}` | {_cell(c['what'])} | " + " | ".join(str(c[k]) for k in keys)
                + " |" for name, c in doc["configs"].items()]
    rows = ["| bounds | property | result | states | transitions | depth | memory | "
            "search (CPU) |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| `{c['config']}` | `{c['property']}` | "
             f"{'**' + c['result'] + '**' if c['result'] != 'verified' else 'verified, 0 errors'}"
             f" | {_states(c)} | {_num(c['transitions'] or 0)} | {_num(c['depth'] or 0)} | "
             f"{c['memory_mb'] or 0:,.0f} MB | {c['search_cpu_s']:.1f} s |" for c in verified]
    muts = ["| mutation | the one-line change | bounds | breaks | counterexample found | "
            "states until found |", "|---|---|---|---|---|---|"]
    for c in mutated:
        m = changes[c["mutation"]]
        label = {"limit": " (a limit, not a bug: assumption A1)",
                 "finding": " (a finding: the code on main)"}.get(m["kind"], "")
        found = "yes" if c["result"] == "counterexample" else f"**no ({c['result']})**"
        muts.append(f"| `{c['mutation']}`{label} | {_cell(m['change'])} | `{c['config']}` | "
                    f"`{c['property']}` | {found} | {_states(c)} |")
    verdict = "PASS" if doc["ok"] else "FAIL"
    stale = []
    current = hashlib.sha256((ROOT / doc["model"]).read_bytes()).hexdigest()
    if current != doc["model_sha256"]:
        stale = ["!!! warning \"Recorded from an earlier version of the model\"",
                 f"    `{doc['model']}` changed since this run; `model/check.py` writes "
                 "new figures.", ""]
    ok_v = sum(c["ok"] for c in verified)
    ok_m = sum(c["ok"] for c in mutated)
    counted = (f"{ok_m} of {len(mutated)} mutations give a counterexample"
               if mutated else "and it repeated every check of the CI run")
    return "\n".join([
        *stale, _provenance(doc), "",
        f"**{verdict}.** {doc['spin']}; model `{doc['model']}` (sha256 "
        f"`{doc['model_sha256'][:12]}`). {ok_v} of {len(verified)} verifications "
        f"complete with no errors, {counted}; the whole run took "
        f"{doc['seconds']:.0f} s wall with {doc['jobs']} jobs (compiling the verifiers "
        f"included).", "", *configs, "", *rows, *(["", *muts] if mutated else [])])


def _render_spin_deep(doc: dict[str, Any]) -> str:
    """Only what ``--deep`` adds to the CI run (its ``*-deep`` bounds)."""
    deep = {name for name in doc["configs"] if name.endswith("-deep")}
    return _render_spin({**doc, "configs": {n: doc["configs"][n] for n in sorted(deep)},
                         "checks": [c for c in doc["checks"] if c["config"] in deep]})


def _render_http_target(doc: dict[str, Any]) -> str:
    rows = ["| sender | records/s | runner's ratio to it |", "|---|---|---|",
            f"| runner `once --target http://…` | {_num(doc['runner_per_s'])} | |",
            f"| bare httpx client, the same appends only | "
            f"{_num(doc['bare_append_per_s'])} | {doc['ratio']:.2f} |",
            f"| bare httpx client, appends and the exact readback of each batch | "
            f"{_num(doc['bare_append_read_per_s'])} | {doc['ratio_with_read']:.2f} |"]
    if "store_alone_per_s" in doc:
        rows.append(f"| runner's store steps alone (no target, no log: runner's ceiling) | "
                    f"{_num(doc['store_alone_per_s'])} | {doc['store_alone_ratio']:.2f} "
                    "of the appends only |")
    if "rows" in doc:  # protocol version 2 (issue 29)
        v2 = doc["rows"]
        met = "met" if v2["ratio"] >= v2["goal"] else "**not met**"
        spread = (f"; rounds {min(v2['ratios']):.2f}-{max(v2['ratios']):.2f}, "
                  f"{v2['to_v1']:.2f}&times; runner against the version-1 server"
                  if "ratios" in v2 else "")
        rows += [f"| runner `once` against `target-serve --dedupe` (version 2: the rows in "
                 f"the append's answer, no readback; {v2['server_reads']} read requests) | "
                 f"{_num(v2['runner_per_s'])} | {v2['ratio']:.2f} of the appends only "
                 f"(goal >= {v2['goal']}: {met}{spread}) |",
                 f"| bare httpx client, the same appends to `target-serve --dedupe` | "
                 f"{_num(v2['bare_append_dedupe_per_s'])} | "
                 f"{v2['bare_append_dedupe_ratio']:.2f} of the appends only (the server's "
                 "dedupe and the rows in its answer) |"]
        if "ceiling" in v2:
            rows.append("| runner's store steps, then the `--dedupe` appends, one after the "
                        "other (runner's own code taking no time: the ceiling of runner "
                        f"against that server) | | {v2['ceiling']:.2f} of the appends only |")
    quota = []
    if "quota" in doc:
        q = doc["quota"]
        within = abs(q["ratio_to_goal"] - 1) <= 0.05
        paced = (f"`start --target-rate {q['target_rate_per_min']}/min`: the write quota"
                 if "target_rate_per_min" in q else
                 f"`start --target-rate {2 * q['quota_per_min']}/min`, measured when "
                 "`--target-rate` still counted every request, two per batch")
        quota = ["", f"With the server's quota at {q['quota_per_min']} appends/minute and "
                 f"batches of {q['batch_size']} ({paced}), over "
                 f"{q['span_s']} s: **{_num(q['per_min'])} records/minute** against quota &times; "
                 f"batch size = {_num(q['goal_per_min'])} (ratio {q['ratio_to_goal']:.3f}; "
                 f"within 5%: {'yes' if within else '**no**'}), {_num(q['rows'])} rows on "
                 f"the server, **{q['duplicates']} duplicated**, "
                 f"{q['rate_limited_lines']} rate-limited answers."]
    return "\n".join([_provenance(doc) + f" {doc['n']:,} records per run at batch size "
                      f"{doc['batch_size']}, median of {doc['rounds']} interleaved rounds.",
                      "", *rows, *quota])


def _render_pg_target(doc: dict[str, Any]) -> str:
    rows = ["| sender | leads/s | ratio to the bare INSERTs |", "|---|---|---|",
            f"| runner in process (`run_cycle`), SQLite store | {_num(doc['runner_per_s'])} | "
            f"**{doc['ratio']:.2f}** (goal >= 0.5) |",
            f"| bare asyncpg, the same `INSERT … ON CONFLICT` batches (the floor) | "
            f"{_num(doc['floor_per_s'])} | 1 |",
            f"| bare asyncpg, each INSERT followed by the same readback | "
            f"{_num(doc['floor_read_per_s'])} | runner's ratio to it: "
            f"{doc['ratio_with_read']:.2f} |",
            *([f"| the target adapter alone, no runner (its `write_batch` and "
               f"`read_back_many` per batch) | {_num(doc['adapter_per_s'])} | its ratio to "
               f"the floor with readback: {doc['adapter_ratio']:.2f} |"]
              if "adapter_per_s" in doc else []),
            f"| runner in process, PostgreSQL store in the same database | "
            f"{_num(doc['runner_pg_store_per_s'])} | {doc['pg_store_ratio']:.2f} |",
            f"| runner `once` as a process, from spawn to exit | {_num(doc['once_per_s'])} | "
            f"{doc['once_ratio']:.2f} |",
            f"| runner `once`, its dispatch span (first send to last confirmation) | "
            f"{_num(doc['once_span_per_s'])} | {doc['once_span_ratio']:.2f} |",
            f"| runner's SQLite store steps alone, no target (runner's ceiling) | "
            f"{_num(doc['store_per_s'])} | {doc['store_alone_ratio']:.2f} |"]
    spent = dict(doc["spent"])
    cycle = spent.pop("cycle")
    parts = ", ".join(f"{name} {value * 1000:,.0f} ms ({value / cycle:.0%})"
                      for name, value in spent.items())
    return "\n".join([
        _provenance(doc) + f" {doc['n']:,} leads per run at batch size {doc['batch_size']}, "
        f"median of {doc['rounds']} paired rounds.", "", *rows, "",
        f"Where runner's in-process cycle went ({doc['n']:,} leads, SQLite store, the "
        f"median round, {cycle * 1000:,.0f} ms): {parts}."])


def _render_delivery_floor(doc: dict[str, Any]) -> str:
    """``python -m bench delivery-floor``: runner's ``once`` against the batched floor, in
    process (dispatch spans) and as a whole process, per store and size; then the top of
    the profile's dispatch thread."""
    stores = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    rows = ["| store | leads | measured | floor | runner | runner / floor | goal | met | "
            "load average (start, end) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for key, label, floor, mine in (
                ("in_process", "in process: first send to last confirmation",
                 "floor_span_per_s", "runner_in_process_per_s"),
                ("whole_process", "whole process (runner: spawn to exit)", "floor_per_s",
                 "runner_whole_process_per_s")):
            goal = r["goals"].get(key)
            met = r["met"].get(key)
            shown = "" if goal is None else f">= {goal} at {doc.get('goal_size', 100_000):,}"
            verdict = "" if met is None else ("yes" if met else "**no**")
            rows.append(f"| {stores[r['backend']]} | {r['n']:,} | {label} | "
                        f"{_num(r[floor])} /s | {_num(r[mine])} /s | "
                        f"**{r['ratios'][key]:.2f}** | {shown} | {verdict} | "
                        f"{r['load_average'][0]:.2f}, {r['load_average'][1]:.2f} |")
    out = [_provenance(doc) + f" Batch size {doc['batch_size']}, median of {doc['rounds']} "
           f"interleaved rounds per row (each ratio the median of the rounds' ratios); wall "
           f"time {doc['seconds']:,.0f} s.", "", *rows]
    profile = doc.get("profile")
    if profile:
        for thread in profile["threads"]:
            if not thread["dispatch"]:
                continue
            run = max((e["cumulative_s"] for e in thread["top"]
                       if e["function"].startswith("runner/tasks/deliver.py")), default=0.0)
            out += ["", f"The profile's dispatch thread (cProfile of `once` in process, "
                    f"{profile['n']:,} leads, SQLite store), its top functions by cumulative "
                    "time (the share is of the dispatch run's, `runner/tasks/deliver.py` "
                    "`run`):", "", "| function | calls | cumulative | share | own |",
                    "|---|---|---|---|---|"]
            for e in thread["top"]:
                share = (f"{e['cumulative_s'] / run:.0%}"
                         if run and e["cumulative_s"] <= run else "")
                out.append(f"| `{_cell(e['function'])}` | {_num(e['calls'])} | "
                           f"{e['cumulative_s']:.3f} s | {share} | {e['own_s']:.3f} s |")
    return "\n".join(out)


def _render_accept_scale(doc: dict[str, Any]) -> str:
    chunk = doc["chunk"]
    rows = [f"| backend | first {chunk:,} leads | last {chunk:,} (store at {doc['n']:,}) | "
            "last / first | goal | met |", "|---|---|---|---|---|---|"]
    for backend, b in doc["backends"].items():
        rows.append(f"| {backend} | {_num(b['first'])} rows/s | {_num(b['last'])} rows/s | "
                    f"{b['ratio']:.2f} | >= {doc['goal']} | "
                    f"{'yes' if b['ratio'] >= doc['goal'] else '**no**'} |")
    return "\n".join([_provenance(doc) + f" {doc['keys'].capitalize()} source keys; SQLite "
                      f"page cache {doc['cache_kib'] // 1024} MiB; wall time {doc['seconds']} s.",
                      "", *rows])


def _render_accept_scale_matrix(_: dict[str, Any]) -> str:
    """The newest ``--matrix`` run of each backend (the two may be separate runs)."""
    newest: dict[str, dict[str, Any]] = {}
    for doc in _all("accept-scale-matrix", ROOT / "bench" / "results"):
        for backend in doc["backends"]:
            newest[backend] = doc
    out = []
    for backend, doc in newest.items():
        rows = [f"| {backend}: write_id, page cache | first {doc['chunk']:,} leads | last "
                f"{doc['chunk']:,} (store at {doc['n']:,}) | last / first |",
                "|---|---|---|---|"]
        rows += [f"| {v} | {_num(m['first'])} rows/s | {_num(m['last'])} rows/s | "
                 f"{m['ratio']:.2f} |" for v, m in doc["backends"][backend].items()]
        out += [_provenance(doc) + f" Median of {doc['rounds']} interleaved round(s).", "",
                *rows, ""]
    return "\n".join(out).rstrip()


def _render_resolve(doc: dict[str, Any]) -> str:
    """``python -m bench resolve``: one ``resolve --all`` against one ``resolve`` per
    record (a sample, extrapolated), both as whole processes."""
    rows = ["| backend | uncertain records | one `resolve --all` | chunks | one `resolve` per "
            "record (mean of the sample) | the loop, extrapolated | ratio |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| {r['backend']} | {_num(r['records'])} | **{r['resolve_all_s']:,.2f} s** | "
             f"{r['chunks']} | {r['single_mean_s'] * 1000:,.0f} ms ({r['single_sample']}) | "
             f"{r['single_loop_s_extrapolated']:,.0f} s | {r['ratio_loop_to_all']:,.0f} |"
             for r in doc["rows"]]
    return "\n".join([_provenance(doc) + " Each figure is a whole process, from its spawn "
                      "to its exit (interpreter start-up included).", "", *rows])


def _render_failover(doc: dict[str, Any]) -> str:
    """``python -m bench failover``: start through a kill -9 and restart of its server."""
    labels = [("failover", "the server's death to the first confirmed delivery"),
              ("restart", "the server's own restart (start to ready, crash recovery "
                          "included)"),
              ("outage", "the server's death to ready"),
              ("lag", "ready to the first confirmed delivery (runner's share)")]
    rows = ["| from … to … | median | max |", "|---|---|---|"]
    rows += [f"| {label} | {doc['summary'][key]['median']:.2f} s | "
             f"{doc['summary'][key]['max']:.2f} s |" for key, label in labels]
    runs = doc["runs"]
    return "\n".join([
        _provenance(doc) + f" {len(runs)} runs of {doc['leads']:,} leads, batches of "
        f"{doc['batch_size']} at {doc['target_rate']}.", "", *rows, "",
        f"Rows written twice at the target: {doc['duplicated_rows']}; records left "
        f"uncertain: {sum(r['uncertain'] for r in runs)} of {doc['leads'] * len(runs):,}."])


def _render_forget(doc: dict[str, Any]) -> str:
    """``python -m bench forget``: failovers on a real pair, SQLite stores emptied,
    deleted or restored; rows per lead at the target, what runner said."""
    what = {"async-lag": "asynchronous pair, standby cut off, half delivered, failover",
            "sqlite": "SQLite store emptied, deleted or restored from an earlier copy",
            "race": "two workers racing for the promoted standby",
            "sync": "synchronous pair, failover during intake or delivery"}
    rows = ["| campaign | rounds | leads at the end | duplicated | acknowledged lost | "
            "uncertain | unsettled | passed |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for mode, m in doc["modes"].items():
        t = m["totals"]
        leads = sum(int(r.get("leads_in_store", 0)) for r in m["rounds"])
        rows.append(f"| {what.get(mode, mode)} | {len(m['rounds'])} | {leads:,} | "
                    f"{t['duplicated']} | {t['lost_acknowledged']} | {t['uncertain']} | "
                    f"{t['unsettled']} | {'yes' if m['ok'] else '**no**'} |")
        if m.get("failover_seconds"):
            f, p = m["failover_seconds"], m["promotion_seconds"]
            notes.append(f"* **{mode}**: the primary's death to the first confirmed delivery "
                         f"through the new primary: median {f['median']:.2f} s, max "
                         f"{f['max']:.2f} s ({f['n']} failovers); the promotion itself: "
                         f"median {p['median']:.2f} s, max {p['max']:.2f} s.")
        if mode == "async-lag":
            notes.append(f"* **{mode}**: acknowledged events lost while the standby was cut "
                         f"off: {m['lost_acknowledged_during_lag']} of "
                         f"{m['acknowledged_after_last_replay']} acknowledged after it last "
                         "had everything; outside that window: "
                         f"{sum(r.get('lost_outside_the_warned_window', 0) for r in m['rounds'])}"
                         "; before the cut runner "
                         f"said: \"{_cell(m['warning_before_the_cut']['detail'])}\".")
        said = next((x["message"] for r in m["rounds"] for x in r.get("runner_said", [])
                     if x.get("action") == "store.rewound"), None)
        if said:
            notes.append(f"* **{mode}**, runner's log: \"{_cell(said)}\".")
        refused = next((r["refused"] for r in m["rounds"] if r.get("refused")), None)
        if refused:
            notes.append(f"* **{mode}**, an emptied or deleted store: `once` exits 78: "
                         f"\"{_cell(refused)}\".")
    return "\n".join([_provenance(doc) + f" Wall time {doc['seconds']} s.", "", *rows, "",
                      *notes])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "accept-scale": _render_accept_scale,
    "accept-scale-random": _render_accept_scale,
    "accept-scale-matrix": _render_accept_scale_matrix,
    "bench": _render_bench,
    "batch": _render_batch,
    "ingest": lambda doc: _render_rates(doc, "accepted by each contender"),
    "peers": lambda doc: _render_rates(doc, "delivered by each contender"),
    "reconcile": _render_reconcile,
    "resolve": _render_resolve,
    "logcost": _render_logcost,
    "sweep-explain": _render_sweep_explain,
    "pipeline": _render_pipeline,
    "chaos": _render_chaos,
    "chaos-http": _render_chaos_http,
    "kill9": _render_kill9,
    "soak": _render_soak,
    "http": _render_bench,
    "status": _render_bench,
    "kill9-http": _render_kill9_http,
    "http-target": _render_http_target,
    "pg-target": _render_pg_target,
    "delivery-floor": _render_delivery_floor,
    "kill9-http-target": _render_kill9,
    "kill9-http-dedupe": _render_kill9_settled,
    "kill9-pg-table": _render_kill9_settled,
    "kill9-settle": _render_kill9_settled,
    "spin": _render_spin,
    "spin-deep": _render_spin_deep,
    "failover": _render_failover,
    "forget": _render_forget,
}


def render_stop_moments(_: str) -> str:
    """Every recorded stop-moment run (before and after a change), one row each."""
    docs = _all("stop-moments", ROOT / "bench" / "results")
    if not docs:
        raise PluginError("gen:stop-moments: no bench/results/stop-moments-*.json file")
    rows = ["| code measured | stops | store write-locked | second worker refused in < 5 s | "
            "second worker, median | source |", "|---|---|---|---|---|---|"]
    return "\n".join([_provenance(docs[-1]), "", *rows,
                      *(_render_stop_moments(d) for d in docs)])


def render_results(arg: str) -> str:
    kind, _, backend = arg.partition(" ")
    if kind not in RENDERERS:
        raise PluginError(f"gen:results: unknown kind {kind!r}")
    directory = ROOT / "bench" / "results"
    docs = [d for d in _all(kind, directory) if not backend or d.get("backend") == backend]
    if not docs:
        return (f"!!! note \"No recorded run yet\"\n    No `bench/results/{kind}-*.json` file"
                f"{' for ' + backend if backend else ''} is in the repository yet: the "
                f"command above writes one.")
    return RENDERERS[kind](docs[-1])


def _all(kind: str, directory: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{kind}-2*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["file"] = f"bench/results/{path.name}"
        out.append(doc)
    return out


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
    rows += [f"| `{name}` | {_cell(check.GUARANTEES[name])} | "
             f"`{_cell(_formula(formulas[name], macros))}` |" for name in check.PROPERTIES]
    return "\n".join(rows)


def render_model_steps(_: str) -> str:
    check = _model_check()
    rows = ["| model step | where in the model | code | crash points | status |",
            "|---|---|---|---|---|"]
    for step in check.load_steps():
        code = ", ".join(f"`{c}`" for c in step["code"]) or "none yet"
        points = ", ".join(f"`{p}`" for p in step["crash_points"]) or "-"
        status = "on main" if step["status"] == "main" else f"**{step['status']}**"
        rows.append(f"| {_cell(step['step'])} | {_cell(step['model'])} | {code} | {points} "
                    f"| {status} |")
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[str], str]] = {
    "cli": render_cli,
    "cli-commands": render_cli_commands,
    "exit-codes": render_exit_codes,
    "crash-points": render_crash_points,
    "lead-transitions": render_lead_transitions,
    "candidate-transitions": render_candidate_transitions,
    "outbox-kinds": render_outbox_kinds,
    "results": render_results,
    "stop-moments": render_stop_moments,
    "include": render_include,
    "api": render_api,
    "model-properties": render_model_properties,
    "model-steps": render_model_steps,
}


# -- MkDocs events ---------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name, arg = match.group(1), (match.group(2) or "").strip()
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: unknown placeholder gen:{name}")
        return GENERATORS[name](arg)

    shown = SKIP.sub(_shown_skip, PLACEHOLDER.sub(replace, markdown))
    return SAVE.sub(lambda m: f"*Save the next block as `{m.group(1)}`:*\n", shown)


#: a python or toml block the docs test saves as a file (``tests/docrun.py``): shown on the page
SAVE = re.compile(r"^<!-- save: ([\w.-]+) -->$", re.MULTILINE)
#: a block the docs test does not run (``tests/docrun.py``), and why: shown on the page
SKIP = re.compile(r'^<!-- skip: next "([^"]+)" -->$', re.MULTILINE)


def _shown_skip(match: re.Match[str]) -> str:
    return f"*(The docs test does not run the next block: {match.group(1)}.)*\n"


def on_post_build(config: Any) -> None:
    if not _seen_commands:
        return  # a partial build (mkdocs serve of one page) checks nothing
    missing = set(_commands()) - _seen_commands
    if missing:
        names = ", ".join(" ".join(p) for p in sorted(missing))
        raise PluginError(f"the CLI reference has no section for: {names}")
