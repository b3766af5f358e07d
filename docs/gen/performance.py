"""The benchmarks' figures (``gen:results KIND``, ``docs/gen/results.py``): one renderer per
kind of ``bench/results/KIND-*.json`` file, each a table of what runner measured beside
its baseline of the same run, and where the figures come from."""

from __future__ import annotations

from typing import Any

from docs.gen.common import ROOT, all_results, cell, num, provenance


def render_bench(doc: dict[str, Any]) -> str:
    rows = ["| benchmark | runner | baseline (same run) | ratio | target | met |",
            "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        digits = 1 if r["unit"] in ("ms", "MB peak") else 0
        base_digits = 1 if r["baseline_unit"] in ("ms",) else 0
        rows.append(f"| {r['name']} | {num(r['figure'], digits)} {r['unit']} | "
                    f"{num(r['baseline'], base_digits)} {r['baseline_unit']} | "
                    f"{r['ratio']:.2f} | {cell(r['target'])} | "
                    f"{'yes' if r['met'] else '**no**'} |")
    notes = [f"* **{r['name']}**: {cell(r['note'])}" for r in doc["rows"] if r["note"]]
    return "\n".join([provenance(doc) + f" Wall time {doc['seconds']} s.", "", *rows, "",
                      "What each baseline is, as the run printed it:", "", *notes])


def render_batch(doc: dict[str, Any]) -> str:
    rows = ["| store | --batch-size | dispatch | with process start-up | "
            "disk, single-row commits | ratio |", "|---|---|---|---|---|---|"]
    stores = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    rows += [f"| {stores[r.get('backend', 'sqlite')]} | {r['batch_size']} | "
             f"{num(r['dispatch_per_s'], 0)} /s | "
             f"{num(r['with_startup_per_s'], 0)} /s | {num(r['disk_commits_per_s'], 0)} /s | "
             f"{r['ratio']:.2f} |" for r in doc["rows"]]
    return "\n".join([provenance(doc) + f" {doc['n']:,} records per run, median of "
                      f"{doc['rounds']} interleaved rounds.", "", *rows])


def render_rates(doc: dict[str, Any], what: str) -> str:
    """A peer comparison (``ingest``, ``peers``): rates, then the ratios with their goals."""
    rows = ["| contender | rows/s |", "|---|---|"]
    rows += [f"| {cell(name)} | {num(rate)} |" for name, rate in doc["rates"].items()]
    rows += ["", "| ratio | value | goal | met |", "|---|---|---|---|"]
    for name, value in doc["ratios"].items():
        goal = doc["goals"].get(name)
        shown = "n/a" if value is None else f"{value:.2f}"
        met = "" if goal is None or value is None else ("yes" if value >= goal else "no")
        rows.append(f"| {cell(name)} | {shown} | {'' if goal is None else f'>= {goal}'} | "
                    f"{met} |")
    if "pg_statement" in doc:  # ingest: where runner's PostgreSQL insert spends its time
        stmt = doc["pg_statement"]
        rows += ["", f"runner's PostgreSQL insert statement, `EXPLAIN ANALYZE` over "
                 f"{stmt['rows']:,} rows in groups of 1,000 on a new store: "
                 f"{stmt['execution_us_per_row']:.1f} µs of server execution per row "
                 "(commit not included), shared as follows.", "",
                 "| part of the statement | share of its execution |", "|---|---|"]
        rows += [f"| {cell(name)} | {share * 100:.0f}% |"
                 for name, share in stmt["shares"].items()]
    skipped = "".join(f" Skipped: {cell(note)}." for note in doc.get("skipped", []))
    return "\n".join([provenance(doc) + f" {doc['n']:,} events {what}, median of "
                      f"{doc['rounds']} interleaved round(s).{skipped}", "", *rows])


def render_logcost(doc: dict[str, Any]) -> str:
    """The dispatch path's log lines: each logged run's own share of its dispatch time,
    beside the ratio of logged to quiet runs (two runs, so noisier)."""
    rows = ["| store, batch size | time spent logging (inside the logged run) | "
            "logged / quiet (two runs) |", "|---|---|---|"]
    for name, share in doc["handler_share"].items():
        ratio = doc["ratios"].get(f"{name}: logged / quiet")
        rows.append(f"| {cell(name)} | {share * 100:.1f}% | "
                    f"{'n/a' if ratio is None else f'{ratio:.2f}'} |")
    skipped = "".join(f" Skipped: {cell(note)}." for note in doc.get("skipped", []))
    return "\n".join([provenance(doc) + f" {doc['n']:,} events per run (a fifth at batch "
                      f"size 1), median of {doc['rounds']} interleaved rounds.{skipped}",
                      "", *rows])


def render_reconcile(doc: dict[str, Any]) -> str:
    """``python -m bench reconcile``: the cost of a cycle over many uncertain records, one
    record per request and in chunks, and delivery under a request quota."""
    cost = ["| backend | reads per request | target requests | cycle time | at "
            f"{doc['quota_per_min']} requests/min |", "|---|---|---|---|---|"]
    for c in doc["costs"]:
        for r in c["rows"]:
            cost.append(f"| {c['backend']} | {r['batch_size']} | {num(r['requests'])} | "
                        f"{r['seconds']:,.2f} s | {r['quota_minutes']:,.1f} min |")
        cost.append(f"| {c['backend']} | before / after | **{c['request_ratio']:g}x** fewer "
                    f"| **{c['time_ratio']:g}x** less | |")
    if "write_quota_per_min" not in doc["quota"][0]:  # before the separate read quota
        quota = ["| --batch-size | leads confirmed per minute | target requests per minute "
                 "| answered rate limited | lost | duplicated |", "|---|---|---|---|---|---|"]
        quota += [f"| {q['batch_size']} | {num(q['leads_per_min'])} | "
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
                  + f" | **{num(q['leads_per_min'])}** | {q['writes_per_min']:g} | "
                  f"{q['reads_per_min']:g} | {q['refused_in_window']} | {q['lost']} | "
                  f"{q['duplicated']} |" for q in doc["quota"]]
        about = (f"Delivery at {doc['quota_per_min']} writes a minute (`--target-rate "
                 f"{doc['quota_per_min']}/min`: every batch write a token; reads not paced, "
                 "or on a read quota of their own, `--target-read-rate`)")
    return "\n".join([
        provenance(doc) + f" A cycle over {doc['uncertain']:,} uncertain records, median of "
        f"{doc['rounds']} alternating rounds:", "", *cost, "",
        f"{about}, over a {doc['window_s']:g} s window; then every record delivered and "
        "the target's rows counted:", "", *quota])


def render_sweep_explain(doc: dict[str, Any]) -> str:
    rows = ["| step | time | ratio |", "|---|---|---|"]
    rows += [f"| {cell(s['step'])} | {s['ms']:,.1f} ms | {s['ratio']:.1f} |"
             for s in doc["steps"]]
    return "\n".join([provenance(doc) + f" {doc['n']:,} candidates, median of "
                      f"{doc['repeat']} fresh run(s).", "", *rows])


def render_pipeline(doc: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in doc.get("versions", {}).items())
    rows = ["| backend | workers | runner, no-op claim + complete | baseline, same run | "
            "baseline | ratio |", "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        mine = f"{num(r['runner']['per_s'])} /s" if r["runner"] else "n/a"
        other = f"{num(r['other']['per_s'])} /s" if r["other"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "n/a"
        rows.append(f"| {r['backend']} | {r['workers']} | {mine} | {cell(r['baseline'])} | "
                    f"{other} | {ratio} |")
    return "\n".join([provenance(doc) + f" N = {doc['n']:,} inputs, runner batch "
                      f"{doc['batch']}; comparison packages: {versions}.", "", *rows])


def render_http_target(doc: dict[str, Any]) -> str:
    rows = ["| sender | records/s | runner's ratio to it |", "|---|---|---|",
            f"| runner `once --target http://…` | {num(doc['runner_per_s'])} | |",
            f"| bare httpx client, the same appends only | "
            f"{num(doc['bare_append_per_s'])} | {doc['ratio']:.2f} |",
            f"| bare httpx client, appends and the exact readback of each batch | "
            f"{num(doc['bare_append_read_per_s'])} | {doc['ratio_with_read']:.2f} |"]
    if "store_alone_per_s" in doc:
        rows.append(f"| runner's store steps alone (no target, no log: runner's ceiling) | "
                    f"{num(doc['store_alone_per_s'])} | {doc['store_alone_ratio']:.2f} "
                    "of the appends only |")
    if "rows" in doc:  # protocol version 2 (issue 29)
        v2 = doc["rows"]
        met = "met" if v2["ratio"] >= v2["goal"] else "**not met**"
        spread = (f"; rounds {min(v2['ratios']):.2f}-{max(v2['ratios']):.2f}, "
                  f"{v2['to_v1']:.2f}&times; runner against the version-1 server"
                  if "ratios" in v2 else "")
        rows += [f"| runner `once` against `target-serve --dedupe` (version 2: the rows in "
                 f"the append's answer, no readback; {v2['server_reads']} read requests) | "
                 f"{num(v2['runner_per_s'])} | {v2['ratio']:.2f} of the appends only "
                 f"(goal >= {v2['goal']}: {met}{spread}) |",
                 f"| bare httpx client, the same appends to `target-serve --dedupe` | "
                 f"{num(v2['bare_append_dedupe_per_s'])} | "
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
                 f"{q['span_s']} s: **{num(q['per_min'])} records/minute** against quota &times; "
                 f"batch size = {num(q['goal_per_min'])} (ratio {q['ratio_to_goal']:.3f}; "
                 f"within 5%: {'yes' if within else '**no**'}), {num(q['rows'])} rows on "
                 f"the server, **{q['duplicates']} duplicated**, "
                 f"{q['rate_limited_lines']} rate-limited answers."]
    return "\n".join([provenance(doc) + f" {doc['n']:,} records per run at batch size "
                      f"{doc['batch_size']}, median of {doc['rounds']} interleaved rounds.",
                      "", *rows, *quota])


def render_pg_target(doc: dict[str, Any]) -> str:
    rows = ["| sender | leads/s | ratio to the bare INSERTs |", "|---|---|---|",
            f"| runner in process (`run_cycle`), SQLite store | {num(doc['runner_per_s'])} | "
            f"**{doc['ratio']:.2f}** (goal >= 0.5) |",
            f"| bare asyncpg, the same `INSERT … ON CONFLICT` batches (the floor) | "
            f"{num(doc['floor_per_s'])} | 1 |",
            f"| bare asyncpg, each INSERT followed by the same readback | "
            f"{num(doc['floor_read_per_s'])} | runner's ratio to it: "
            f"{doc['ratio_with_read']:.2f} |",
            *([f"| the target adapter alone, no runner (its `write_batch` per batch, "
               f"answering with the rows) | {num(doc['adapter_per_s'])} | "
               f"{doc['adapter_alone_ratio']:.2f} |"]
              if "adapter_alone_ratio" in doc else
              [f"| the target adapter alone, no runner (its `write_batch` and "
               f"`read_back_many` per batch) | {num(doc['adapter_per_s'])} | its ratio to "
               f"the floor with readback: {doc['adapter_ratio']:.2f} |"]
              if "adapter_per_s" in doc else []),
            f"| runner in process, PostgreSQL store in the same database | "
            f"{num(doc['runner_pg_store_per_s'])} | {doc['pg_store_ratio']:.2f} |",
            f"| runner `once` as a process, from spawn to exit | {num(doc['once_per_s'])} | "
            f"{doc['once_ratio']:.2f} |",
            f"| runner `once`, its dispatch span (first send to last confirmation) | "
            f"{num(doc['once_span_per_s'])} | {doc['once_span_ratio']:.2f} |",
            f"| runner's SQLite store steps alone, no target (runner's ceiling) | "
            f"{num(doc['store_per_s'])} | {doc['store_alone_ratio']:.2f} |"]
    spent = dict(doc["spent"])
    cycle = spent.pop("cycle")
    parts = ", ".join(f"{name} {value * 1000:,.0f} ms ({value / cycle:.0%})"
                      for name, value in spent.items())
    overlap = ("; a store step runs beside a send (the pipelined run), so the time both "
               "ran is counted in each and the parts, less it, make the cycle"
               if "store step and send at once" in spent else "")
    return "\n".join([
        provenance(doc) + f" {doc['n']:,} leads per run at batch size {doc['batch_size']}, "
        f"median of {doc['rounds']} paired rounds.", "", *rows, "",
        f"Where runner's in-process cycle went ({doc['n']:,} leads, SQLite store, the "
        f"median round, {cycle * 1000:,.0f} ms): {parts}{overlap}."])


#: the groups of row triggers ``bench.pipeline_spans`` drops from a copy of the store to
#: time the statement without them (its ``TRIGGER_GROUPS``), as the spans table says it
WITHOUT_TRIGGERS = {
    "counts": "without the triggers that keep the counts per state and per outbox kind "
              "(`lead_counts_state`, `outbox_counted`)",
    "event": "without the trigger that inserts each row's outbox event "
             "(`leads_state_changed`; the event's count then does not run either)",
    "guards": "without the guards' triggers (`leads_transition_guard`, "
              "`leads_resend_needs_decision`)",
    "all": "without any of the six triggers the statement fires",
}


def render_delivery_floor(doc: dict[str, Any]) -> str:
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
                 "runner_whole_process_per_s"),
                ("pipelined_in_process", "in process, `--dispatch-pipeline on`",
                 "floor_span_per_s", "runner_pipelined_in_process_per_s"),
                ("pipelined_whole_process", "whole process, `--dispatch-pipeline on`",
                 "floor_per_s", "runner_pipelined_whole_process_per_s")):
            if mine not in r:
                continue  # a results file from before the pipelined dispatch
            goal = r["goals"].get(key)
            met = r["met"].get(key)
            shown = "" if goal is None else f">= {goal} at {doc.get('goal_size', 100_000):,}"
            verdict = "" if met is None else ("yes" if met else "**no**")
            rows.append(f"| {stores[r['backend']]} | {r['n']:,} | {label} | "
                        f"{num(r[floor])} /s | {num(r[mine])} /s | "
                        f"**{r['ratios'][key]:.2f}** | {shown} | {verdict} | "
                        f"{r['load_average'][0]:.2f}, {r['load_average'][1]:.2f} |")
    out = [provenance(doc) + f" Batch size {doc['batch_size']}, median of {doc['rounds']} "
           f"interleaved rounds per row (each ratio the median of the rounds' ratios); wall "
           f"time {doc['seconds']:,.0f} s.", "", *rows]
    profile = doc.get("profile")
    if profile:
        for thread in profile["threads"]:
            if not thread["dispatch"]:
                continue
            run = max((e["cumulative_s"] for e in thread["top"]
                       if e["function"].startswith(("runner/tasks/deliver.py",
                                                    "runner/tasks/pagerun.py"))),
                      default=0.0)
            out += ["", f"The profile's dispatch thread (cProfile of `once` in process, "
                    f"{profile['n']:,} leads, SQLite store), its top functions by cumulative "
                    "time (the share is of the dispatch run's `run`, in "
                    "`runner/tasks/deliver.py`, since split off to "
                    "`runner/tasks/pagerun.py`):", "",
                    "| function | calls | cumulative | share | own |",
                    "|---|---|---|---|---|"]
            for e in thread["top"]:
                share = (f"{e['cumulative_s'] / run:.0%}"
                         if run and e["cumulative_s"] <= run else "")
                out.append(f"| `{cell(e['function'])}` | {num(e['calls'])} | "
                           f"{e['cumulative_s']:.3f} s | {share} | {e['own_s']:.3f} s |")
    spans = doc.get("pipeline_spans")
    if spans:
        ms = spans["per_batch_ms"]
        out += ["", f"Where a pipelined batch's time goes (`once --dispatch-pipeline on` in "
                f"process, {spans['n']:,} leads, {spans['batches']} batches, SQLite store; "
                "timers around runner's own steps, no profiler), milliseconds per batch:",
                "", "| span | ms per batch |", "|---|---|"]
        for label, value in (
                ("the run's pace (its whole time over its batches)", spans["pace_ms"]),
                ("the request (map, write, readback, judge), dispatch thread",
                 ms.get("request")),
                ("the commit beside it, its own thread", ms.get("commit")),
                ("… the batch statement's first step (its rows change)", ms.get("statement")),
                ("… its RETURNING rows", ms.get("returning")),
                ("… its `COMMIT` (the fsync)", ms.get("fsync")),
                ("the dispatch thread waiting for the commit", ms.get("waited")),
                ("the same statement with its RETURNING rows, alone (no other thread "
                 "running; rolled back, so no fsync)", spans["alone_ms"]),
                *((f"… alone, {label}", spans.get("without_ms", {}).get(group))
                  for group, label in WITHOUT_TRIGGERS.items())):
            if value is not None:
                out.append(f"| {label} | {value:.1f} |")
        untriggered = spans.get("untriggered")
        if untriggered:
            out += ["", f"The same pipelined `once` on a copy of the prepared store with the "
                    f"six triggers dropped, in {untriggered['pairs']} pairs with a copy as "
                    f"made (the order alternating; each rate over the run's dispatch span, "
                    f"medians): {num(untriggered['untriggered_per_s'])} leads/s against "
                    f"{num(untriggered['runner_per_s'])} leads/s, "
                    f"**{untriggered['ratio']:.2f}x**."]
    return "\n".join(out)


def render_delivery_scale(doc: dict[str, Any]) -> str:
    """``python -m bench delivery-scale``: ``once`` over a million leads against a hundred
    thousand, the large run between two small ones, per store and dispatch."""
    stores = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    rows = ["| store | dispatch | leads | in process | whole process | large / small, in "
            "process | whole process | goal | met |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        dispatch = "`--dispatch-pipeline on`" if r["dispatch_pipeline"] == "on" else "serial"
        for run in r["runs"]:
            large = run["n"] == r["large"]
            rows.append(
                f"| {stores[r['backend']]} | {dispatch} | {run['n']:,} | "
                f"{num(run['in_process_per_s'])} /s | {num(run['whole_process_per_s'])} /s | "
                + (f"**{r['ratio_in_process']:.2f}** | {r['ratio_whole_process']:.2f} | "
                   f">= {r['goal']} | {'yes' if r['met'] else '**no**'} |" if large else
                   "| | | |"))
    return "\n".join([provenance(doc) + f" Each large run between two small ones, against "
                      f"their mean; wall time {doc['seconds']:,.0f} s.", "", *rows])


def render_webhook_floor(doc: dict[str, Any]) -> str:
    """``python -m bench webhook-floor``: ``runner serve``'s signed intake beside the
    minimal ASGI floor on the same server, with each side's latencies; then, when the run
    profiled ``runner serve``, the top of its event loop by own time."""
    runner, floor = doc["runner"], doc["floor"]
    rows = ["| server | requests/s | p50 | p99 | server CPU per request |",
            "|---|---|---|---|---|"]
    rows += [f"| {label} | {num(side['per_s'])} | {side['p50_ms']:.1f} ms | "
             f"{side['p99_ms']:.1f} ms | {side['cpu_us']:.0f} µs |"
             for label, side in (("`runner serve`", runner),
                                 ("the floor (`bench/webhook_floor.py`)", floor))]
    rounds = ", ".join(f"{r:.2f}" for r in doc["round_ratios"])
    out = [provenance(doc) + f" {doc['n']:,} signed events per side per round, "
           f"{doc['clients']} keep-alive clients, medians of {doc['rounds']} interleaved "
           f"rounds; wall time {doc['seconds']:,.0f} s.", "", *rows, "",
           f"**runner serve / floor: {doc['ratio']:.2f}** (goal >= {doc['goal']}: "
           f"{'met' if doc['met'] else '**not met**'}; the rounds: {rounds}). By server "
           f"CPU per request, the floor / runner: {doc['cpu_ratio']:.2f}."]
    if "accept_per_s" in doc:
        out[-1] += (f" In the same rounds, {doc['clients']} in-process `accept` callers "
                    f"took {num(doc['accept_per_s'])} events/s; `runner serve` is "
                    f"{doc['accept_ratio']:.2f} of them.")
    profile = doc.get("profile")
    if profile:
        out += ["", "`runner serve`'s main thread (its event loop) under the same load, "
                "profiled with cProfile in one more round that is not counted, its top "
                f"functions by own time ({profile['total_own_s']:,.1f} s in all):", "",
                "| function | calls | own | cumulative |", "|---|---|---|---|"]
        out += [f"| `{cell(e['function'])}` | {num(e['calls'])} | {e['own_s']:.3f} s | "
                f"{e['cumulative_s']:.3f} s |" for e in profile["top"]]
    return "\n".join(out)


def render_startup(doc: dict[str, Any]) -> str:
    """``python -m bench startup``: an idle ``once`` against ``python -c pass`` in pairs,
    then a whole-process dispatch against the disk's single-row commit rate, with where
    the process's time went."""
    start, dispatch = doc["start"], doc["dispatch"]
    diff, cpu = start["difference_s"], start["cpu_difference_s"]

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:,.0f} ms"

    rows = ["| measured | figure | baseline | result | goal | met |",
            "|---|---|---|---|---|---|",
            f"| an idle `once` on a warm store, whole process ({start['pairs']} pairs) | "
            f"{ms(start['once_s'])} | `python -c pass`: {ms(start['pass_s'])} | "
            f"**{ms(diff['median'])}** more (p25-p75 {ms(diff['p25'])}-{ms(diff['p75'])}; "
            f"CPU {ms(cpu['median'])} more) | <= {ms(start['goal_s'])} | "
            f"{'yes' if start['met'] else '**no**'} |",
            f"| dispatch of {dispatch['n']:,} leads, whole process ({dispatch['rounds']} "
            f"rounds) | {num(dispatch['per_s'])} /s | single-row commits: "
            f"{num(dispatch['commits_per_s'])} /s | **{dispatch['ratio']:.2f}x** (the "
            f"dispatch span alone: {dispatch['in_process_ratio']:.2f}x) | "
            f">= {dispatch['goal']:g}x | {'yes' if dispatch['met'] else '**no**'} |"]
    if "floor_ratio" in dispatch:
        reach = dispatch["floor_with_start_ratio"]
        rows.append(
            f"| the batched floor over as many leads, in the same rounds (the contract's "
            f"steps in a plain `sqlite3` loop, no process start) | "
            f"{num(dispatch['floor_per_s'])} /s | single-row commits, as above | "
            f"{dispatch['floor_ratio']:.2f}x; a whole process as fast as it, started "
            f"within the start goal: **{reach:.2f}x** | >= {dispatch['goal']:g}x | "
            f"{'yes' if reach >= dispatch['goal'] else '**no**'} |")
    spans = dispatch["spans_s"]
    whole = dispatch["n"] / dispatch["per_s"]
    labels = {"start": "spawn to `target.pinned` (the start)",
              "to_first_send": "to the first send (recovery, the models, the first page)",
              "dispatch": "the dispatch span (first send to last confirmation)",
              "to_exit": "to exit (the poll pass, closing, the exit)"}
    span_rows = ["| span of the dispatch run | seconds | share |", "|---|---|---|"]
    span_rows += [f"| {labels[name]} | {s:.3f} s | {s / whole:.0%} |"
                  for name, s in spans.items()]
    load = doc["load_average"]
    verdict: list[str] = []
    if "floor_ratio" in dispatch:
        reach, goal = dispatch["floor_with_start_ratio"], dispatch["goal"]
        verdict = ["", (
            f"To meet the dispatch goal with the start goal met, a dispatch would have to "
            f"run **{dispatch['needed_over_floor']:.2f}x** the batched floor's rate "
            f"(the floor that [point 1](#delivery-against-a-batched-floor) judges "
            f"runner's delivery against, and which runner reaches a share of): a process "
            f"as fast as the floor, started within the start goal, would reach "
            f"{reach:.2f}x the disk's single-row commit rate, against {goal:g}x."
            if reach < goal else
            f"The dispatch goal is within the batched floor's reach in this run: a process "
            f"as fast as the floor, started within the start goal, would reach "
            f"{reach:.2f}x the disk's single-row commit rate, against {goal:g}x.")]
    return "\n".join([provenance(doc) + f" Load average {load[0]:.2f} at the start; "
                      f"wall time {doc['seconds']:,.0f} s.", "",
                      *rows, *verdict, "", *span_rows])


def render_accept_scale(doc: dict[str, Any]) -> str:
    chunk = doc["chunk"]
    rows = [f"| backend | first {chunk:,} leads | last {chunk:,} (store at {doc['n']:,}) | "
            "last / first | goal | met |", "|---|---|---|---|---|---|"]
    for backend, b in doc["backends"].items():
        rows.append(f"| {backend} | {num(b['first'])} rows/s | {num(b['last'])} rows/s | "
                    f"{b['ratio']:.2f} | >= {doc['goal']} | "
                    f"{'yes' if b['ratio'] >= doc['goal'] else '**no**'} |")
    return "\n".join([provenance(doc) + f" {doc['keys'].capitalize()} source keys; SQLite "
                      f"page cache {doc['cache_kib'] // 1024} MiB; wall time {doc['seconds']} s.",
                      "", *rows])


def render_accept_scale_matrix(_: dict[str, Any]) -> str:
    """The newest ``--matrix`` run of each backend (the two may be separate runs)."""
    newest: dict[str, dict[str, Any]] = {}
    for doc in all_results("accept-scale-matrix", ROOT / "bench" / "results"):
        for backend in doc["backends"]:
            newest[backend] = doc
    out = []
    for backend, doc in newest.items():
        rows = [f"| {backend}: write_id, page cache | first {doc['chunk']:,} leads | last "
                f"{doc['chunk']:,} (store at {doc['n']:,}) | last / first |",
                "|---|---|---|---|"]
        rows += [f"| {v} | {num(m['first'])} rows/s | {num(m['last'])} rows/s | "
                 f"{m['ratio']:.2f} |" for v, m in doc["backends"][backend].items()]
        out += [provenance(doc) + f" Median of {doc['rounds']} interleaved round(s).", "",
                *rows, ""]
    return "\n".join(out).rstrip()


def render_resolve(doc: dict[str, Any]) -> str:
    """``python -m bench resolve``: one ``resolve --all`` against one ``resolve`` per
    record (a sample, extrapolated), both as whole processes."""
    rows = ["| backend | uncertain records | one `resolve --all` | chunks | one `resolve` per "
            "record (mean of the sample) | the loop, extrapolated | ratio |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| {r['backend']} | {num(r['records'])} | **{r['resolve_all_s']:,.2f} s** | "
             f"{r['chunks']} | {r['single_mean_s'] * 1000:,.0f} ms ({r['single_sample']}) | "
             f"{r['single_loop_s_extrapolated']:,.0f} s | {r['ratio_loop_to_all']:,.0f} |"
             for r in doc["rows"]]
    return "\n".join([provenance(doc) + " Each figure is a whole process, from its spawn "
                      "to its exit (interpreter start-up included).", "", *rows])
