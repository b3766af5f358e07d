"""The reliability campaigns' and the model check's figures (``gen:results KIND``,
``docs/gen/results.py``): chaos, kill -9, the soak, stop moments, failovers and lost
stores, and the SPIN runs, one renderer per kind of ``bench/results/KIND-*.json`` file."""

from __future__ import annotations

import hashlib
from typing import Any

from docs.gen.common import ROOT, cell, num, provenance


def render_chaos(doc: dict[str, Any]) -> str:
    verdict = "PASS" if doc["ok"] else "FAIL"
    rows = ["| crash point | runs dealt | fired | restart crashed too |", "|---|---|---|---|"]
    rows += [f"| `{p}` | {v['runs']} | {v['fired']} | {v['restart_crashed']} |"
             for p, v in doc["points"].items()]
    states = ", ".join(f"{k} {num(v)}" for k, v in doc["end_states"].items())
    candidates = ", ".join(f"{k} {num(v)}" for k, v in doc["candidates"].items())
    lines = [
        provenance(doc), "",
        f"**{verdict}, {len(doc['violations'])} violations.** Backend {doc['backend']}, "
        f"{doc['runs']:,} runs (seed {doc['seed']}, {doc['jobs']} jobs, "
        f"{doc['seconds'] / 60:.1f} min): {doc['fired']:,} crashed at their dealt point, "
        f"{doc['not_reached']:,} never reached it, and {doc['restart_crashed']:,} restarts "
        f"crashed again at a second point.", "",
        f"* end states of {num(doc['records'])} records: {states};",
        f"* {num(doc['target_rows'])} target rows; "
        f"{num(doc['recovered_by_readback'])} records recovered from uncertain by readback;",
        f"* candidates: {candidates}.", "", *rows]
    return "\n".join(lines)


def render_chaos_http(doc: dict[str, Any]) -> str:
    """``bench/chaos.py --http-target``: the chaos table, and what the faulty servers did."""
    served = doc.get("served", {})
    faults = ", ".join(f"`{k}` {v}" for k, v in sorted(doc.get("faults", {}).items()))
    return "\n".join([
        render_chaos(doc), "",
        f"Server faults switched on (episodes): {faults}. The faulty servers applied "
        f"{num(served.get('appends', 0))} appends ({num(served.get('rows', 0))} rows), "
        f"dropped the connection after applying {num(served.get('dropped', 0))} of them, "
        f"and answered {num(served.get('throttled', 0))} appends 429."])


def render_kill9(doc: dict[str, Any]) -> str:
    verdict = "PASS" if doc["ok"] else "FAIL"
    t = doc["totals"]
    head = ["run", "leads", "kills", "confirmed", "uncertain", "recovered", "lost",
            "duplicated", "unexpected", "seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        rows.append("| " + " | ".join(str(r[c]) for c in head) + " |")
    rows.append("| **total** | " + " | ".join(f"**{t[c]}**" for c in head[1:]) + " |")
    return "\n".join([
        provenance(doc), "",
        f"**{verdict}** (lost = duplicated = unexpected = 0 required). Backend "
        f"{doc['backend']}, {doc['runs']} runs of {doc['leads']:,} leads (seed {doc['seed']}, "
        f"kills within {doc['max_delay']:.2f} s of each start, {doc['seconds'] / 60:.1f} min): "
        f"{t['kills']} kills, {t['recovered']} records recovered by readback, "
        f"{t['uncertain']} left uncertain, {t['lost']} lost, {t['duplicated']} duplicated, "
        f"{t['unexpected']} unexpected.", "", *rows, *_kill9_faults(doc)])


def render_kill9_settled(doc: dict[str, Any]) -> str:
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
        provenance(doc), "",
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


def render_soak(doc: dict[str, Any]) -> str:
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
        f"| outbox rows at the end (of {num(doc['outbox_last_seq'])} written) | "
        f"{num(doc['outbox_rows_at_end'])} | - |",
    ]
    if "pipeline_rows_at_end" in doc:
        removed = doc.get("pipeline_removed", {})
        rows.append(f"| pipeline rows at the end (records, work, histories) | "
                    f"{num(doc['pipeline_rows_at_end'])} | - |")
        rows.append(f"| pipeline rows pruned ({doc.get('pipeline_prunes', 0)} prunes, "
                    f"`--before {doc.get('pipeline_keep', '')}`) | "
                    f"{num(sum(removed.values()))} | - |")
    rows.append(f"| stderr (MiB a minute) | {doc['stderr_mib_per_min']:.3f} | - |")
    if doc.get("violations"):
        rows += ["", "Violations:", ""] + [f"* {cell(v)}" for v in doc["violations"]]
    return "\n".join([
        head, "",
        f"**{verdict}.** {doc['minutes']:g} minutes on {doc['backend']}: {doc['rate']:g} leads/s "
        f"fed, {doc['churn']:g} status changes/s, kill -9 every {doc['kill_every']:g} s "
        f"({doc['kills']} kills). {num(doc['accepted'])} accepted, "
        f"{num(doc['confirmed'])} confirmed, {doc['uncertain']} uncertain, "
        f"**{doc['lost']} lost, {doc['duplicated']} duplicated, {doc['unexpected']} "
        f"unexpected**; {num(doc['exported_events'])} events exported and "
        f"{num(doc['pruned_events'])} pruned, {doc['export_gaps']} export gaps"
        + ("; `VACUUM` after each retention pass (the server's autovacuum is off)"
           if doc.get("pg_vacuum") else "") + ".", "",
        *rows])


def _store_path(samples: list[dict[str, Any]]) -> str:
    third = samples[-1]["t"] / 3
    mid = next((x for x in samples if x["t"] >= third), samples[-1])
    return f"{mid['store_mib']:.1f} / {samples[-1]['store_mib']:.1f}"


def render_stop_moment_run(doc: dict[str, Any]) -> str:
    return (f"| {cell(doc['label'])} | {doc['trials']} | {doc['write_locked']} "
            f"({doc['write_locked_fraction']:.0%}) | {doc['second_refused_within_5s']} | "
            f"{doc['second_median_seconds']:.1f} s | `{doc['file']}` |")


def render_kill9_http(doc: dict[str, Any]) -> str:
    head = ["run", "leads", "kills", "answered", "retried", "lost", "twice", "duplicated",
            "wrong", "confirmed", "uncertain"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        rows.append("| " + " | ".join(str(r[c]) for c in head) + " |")
    t = doc["totals"]
    rows.append("| **total** | " + " | ".join(f"**{t[c]}**" for c in head[1:]) + " |")
    verdict = "PASS" if doc["ok"] else "FAIL"
    return "\n".join([
        provenance(doc), "",
        f"**{verdict}** (lost = twice = duplicated = wrong = 0 required). Backend "
        f"{doc['backend']}, {doc['runs']} runs of {doc['leads']:,} leads (seed {doc['seed']}, "
        f"{doc['seconds'] / 60:.1f} min): {t['kills']} kills under load, {t['answered']} "
        f"answers, {t['lost']} lost, {t['twice']} answered twice, {t['duplicated']} "
        f"duplicated in the target.", "", *rows])


def _states(c: dict[str, Any]) -> str:
    text = num(c["states_stored"]) if c["states_stored"] is not None else "?"
    if c.get("states_visited"):
        text += f" ({num(c['states_visited'])} visited)"
    return text


def render_spin(doc: dict[str, Any]) -> str:
    checks = doc["checks"]
    verified = [c for c in checks if c["mutation"] is None]
    mutated = [c for c in checks if c["mutation"] is not None]
    changes = {m["macro"]: m for m in doc["mutations"]}
    keys = ["N", "BATCH", "WORKERS", "MAXCRASH", "MAXFAULT", "MAXRESOLVE", "NETCAP"]
    configs = ["| bounds | what | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    configs += [f"| `{name}` | {cell(c['what'])} | " + " | ".join(str(c[k]) for k in keys)
                + " |" for name, c in doc["configs"].items()]
    rows = ["| bounds | property | result | states | transitions | depth | memory | "
            "search (CPU) |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| `{c['config']}` | `{c['property']}` | "
             f"{'**' + c['result'] + '**' if c['result'] != 'verified' else 'verified, 0 errors'}"
             f" | {_states(c)} | {num(c['transitions'] or 0)} | {num(c['depth'] or 0)} | "
             f"{c['memory_mb'] or 0:,.0f} MB | {c['search_cpu_s']:.1f} s |" for c in verified]
    muts = ["| mutation | the one-line change | bounds | breaks | counterexample found | "
            "states until found |", "|---|---|---|---|---|---|"]
    for c in mutated:
        m = changes[c["mutation"]]
        label = {"limit": " (a limit, not a bug: assumption A1)",
                 "finding": " (a finding: the code on main)"}.get(m["kind"], "")
        found = "yes" if c["result"] == "counterexample" else f"**no ({c['result']})**"
        muts.append(f"| `{c['mutation']}`{label} | {cell(m['change'])} | `{c['config']}` | "
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
        *stale, provenance(doc), "",
        f"**{verdict}.** {doc['spin']}; model `{doc['model']}` (sha256 "
        f"`{doc['model_sha256'][:12]}`). {ok_v} of {len(verified)} verifications "
        f"complete with no errors, {counted}; the whole run took "
        f"{doc['seconds']:.0f} s wall with {doc['jobs']} jobs (compiling the verifiers "
        f"included).", "", *configs, "", *rows, *(["", *muts] if mutated else [])])


def render_spin_deep(doc: dict[str, Any]) -> str:
    """Only what ``--deep`` adds to the CI run (its ``*-deep`` bounds)."""
    deep = {name for name in doc["configs"] if name.endswith("-deep")}
    return render_spin({**doc, "configs": {n: doc["configs"][n] for n in sorted(deep)},
                         "checks": [c for c in doc["checks"] if c["config"] in deep]})


def render_failover(doc: dict[str, Any]) -> str:
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
        provenance(doc) + f" {len(runs)} runs of {doc['leads']:,} leads, batches of "
        f"{doc['batch_size']} at {doc['target_rate']}.", "", *rows, "",
        f"Rows written twice at the target: {doc['duplicated_rows']}; records left "
        f"uncertain: {sum(r['uncertain'] for r in runs)} of {doc['leads'] * len(runs):,}."])


def render_forget(doc: dict[str, Any]) -> str:
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
                         f"said: \"{cell(m['warning_before_the_cut']['detail'])}\".")
        said = next((x["message"] for r in m["rounds"] for x in r.get("runner_said", [])
                     if x.get("action") == "store.rewound"), None)
        if said:
            notes.append(f"* **{mode}**, runner's log: \"{cell(said)}\".")
        refused = next((r["refused"] for r in m["rounds"] if r.get("refused")), None)
        if refused:
            notes.append(f"* **{mode}**, an emptied or deleted store: `once` exits 78: "
                         f"\"{cell(refused)}\".")
    return "\n".join([provenance(doc) + f" Wall time {doc['seconds']} s.", "", *rows, "",
                      *notes])
