"""When the store loses its memory (issue 30, "Proof"): PostgreSQL failovers on a real
primary/standby pair, and SQLite stores emptied, deleted or restored from an earlier copy;
the target's rows are counted per lead, and nothing may be there twice.

    python -m bench forget                        # every mode, full sizes; writes
                                                  # bench/results/forget-<UTC>.json
    python -m bench forget --mode async-lag       # one mode (async-lag, sqlite, race, sync)
    python -m bench forget --quick [--json PATH]  # small sizes, for CI (writes no results
                                                  # file; --json writes the same document)

Everything runs as an operator meets it: ``runner`` commands as real processes (``run.py``),
a real pair (``harness.pgpair``: two clusters on private loopback ports, streaming
replication, a real ``kill -9`` of the primary's postmaster and a real ``pg_ctl promote``),
the store on the pair through the multi-host DSN (``target_session_attrs=read-write``), and
the synthetic target's file (``--target t.db``), which keeps batch marks.  Each round makes
its pair anew (``make_pair``: about 2 s here), so every failover meets a fresh standby.

Modes:

``async-lag``
    The issue's headline reproduction.  An asynchronous pair; N leads accepted by
    concurrent ``runner accept`` callers (real processes, each feeding its share on stdin
    and answering one line per commit: an answered line is an acknowledged event); the
    standby replays them all; then the stream is cut (``Pair.lag``), about half are
    delivered (``start --cycles 1 --dispatch-limit N/2``), the primary is killed and the
    standby promoted, and ``once`` runs against the new primary until nothing is left to
    send.  Variant ``after-intake``: intake ends before the cut (no acknowledged event can
    be lost).  Variant ``during-lag``: the callers go on accepting through the cut and the
    delivery until the kill; every acknowledged event missing on the new primary is
    counted, and each must lie in the window runner warned about (acknowledged after the
    last moment the standby was proven to have replayed everything); after the promotion
    the callers send again what was never acknowledged, as a source does.
``sqlite``
    A SQLite store ``emptied`` (truncated to 0 bytes), ``deleted`` (with its side files)
    or ``restored`` (replaced by a copy taken at a random moment: after a random number of
    accepted and of delivered leads); then the same events accepted again (new write_ids
    where the store forgot them) and ``once``.  An emptied or deleted store is refused
    (exit 78, naming ``runner target adopt``): that refusal is recorded, then the target
    is adopted with ``--reason`` and ``once`` runs again.
``race``
    A synchronous pair; a ``start`` worker delivering at a paced rate; the primary killed
    and the standby promoted; a second ``start`` started at once, in its own process
    group (``start_new_session``), while the first waits out its reconnect backoff:
    exactly one holds the lock and delivers, the other steps aside (exit 75; or, for the
    second, exit 74 when the kill ends its session, or no host takes writes yet, while it
    is still starting: start-up does not wait for a store, only a running worker does).
``sync``
    A synchronous pair per failover; concurrent ``accept`` callers and a ``start`` worker
    at the default batch; the primary killed at a random moment, during the intake or
    during the delivery; the callers send again what was never acknowledged; ``start``
    rides through by itself.  0 acknowledged events lost, 0 duplicated rows.  Failover
    time (as ``bench/failover.py`` takes it): from just before the ``kill -9``
    (``t_kill``) to the first confirmation logged by ``start`` after its
    ``store.reconnected`` line; beside it the promotion (``pg_ctl promote`` until the
    standby commits a write).

Counted per round: ``duplicated`` (leads with more than one row at the target: must be 0),
``lost_acknowledged`` (acknowledged, absent from the store at the end), ``unsettled``
(records neither confirmed nor uncertain at the end: must be 0), ``uncertain`` (visible,
never resent), and what runner said (``store.rewind`` / ``store.rewound`` log lines, the
refusal of a foreign target, the replication guarantee).

Here: the campaign (the sizes, each mode's rounds, what must hold, the document); one
round of each mode is ``bench/forget_rounds.py``, the processes and the audit they share
``bench/forget_kit.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from bench.forget_rounds import lag_round, race_round, sqlite_round, sync_round  # noqa: E402
from bench.results import record  # noqa: E402

MODES = ("async-lag", "sqlite", "race", "sync")
#: sizes: (full, quick)
SIZES: dict[str, dict[str, int]] = {
    "full": {"lag_leads": 3000, "lag_rounds": 5, "sqlite_leads": 300, "sqlite_rounds": 4,
             "race_rounds": 5, "race_leads": 300, "sync_failovers": 20, "sync_leads": 2000,
             "callers": 4, "lag_intake_seconds": 8, "sqlite_callers": 2},
    "quick": {"lag_leads": 300, "lag_rounds": 1, "sqlite_leads": 60, "sqlite_rounds": 1,
              "race_rounds": 1, "race_leads": 60, "sync_failovers": 2, "sync_leads": 2000,
              "callers": 3, "lag_intake_seconds": 3, "sqlite_callers": 1},
}


# -- the campaign -------------------------------------------------------------------------

def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3),
            "min": round(min(values), 3), "n": len(values)}


def _totals(rounds: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("duplicated", "duplicated_rows", "lost_acknowledged", "unsettled", "uncertain",
            "uncertain_with_a_row", "confirmed_without_a_row", "confirmed", "acknowledged")
    return {k: sum(int(r.get(k, 0)) for r in rounds) for k in keys}


def stepped_aside(r: dict[str, Any]) -> bool:
    """The race's loser stepped aside: exit 75 (another worker holds the lock), or the
    second, still starting when the kill ended its session or before the standby took
    writes, exit 74 with what it found said (start-up does not wait for a store)."""
    return bool(r["loser_exit"] == 75 or (
        r.get("loser") == "second" and r["loser_exit"] == 74 and r.get("loser_said")))


def verdict(mode: str, rounds: list[dict[str, Any]]) -> list[str]:
    """What must hold in ``mode``; the violations (empty: the mode passes)."""
    bad = []
    for r in rounds:
        tag = f"{mode} round {r['round']} {r.get('variant') or r.get('how') or ''}".strip()
        if r["duplicated"]:
            bad.append(f"{tag}: {r['duplicated']} leads with more than one row")
        if r["unsettled"]:
            bad.append(f"{tag}: {r['unsettled']} records neither confirmed nor uncertain")
        if r["uncertain_with_a_row"] or r["confirmed_without_a_row"]:
            bad.append(f"{tag}: states disagree with the target's rows")
        promised = mode in ("sync", "race", "sqlite") or r.get("variant") == "after-intake"
        if promised and r["lost_acknowledged"]:
            bad.append(f"{tag}: {r['lost_acknowledged']} acknowledged events lost")
        if r.get("lost_outside_the_warned_window"):
            bad.append(f"{tag}: lost acknowledged events outside the window runner warned of")
        # a restored copy taken after the last send is not behind: nothing to find
        behind = r.get("how") != "restored" or (
            r["rows_before_reaccept"] > r["copy_after_delivered"])
        if mode in ("async-lag", "sqlite") and behind and not any(
                x.get("action") == "store.rewind" for x in r["runner_said"]):
            bad.append(f"{tag}: no store.rewind line: runner did not say what it found")
        if mode == "sqlite" and r["how"] in ("emptied", "deleted") and (
                r.get("once_exit") != 78 or "runner target adopt" not in str(r.get("refused"))
                or r.get("rows_after_refusal") != r.get("rows_before_reaccept")):
            bad.append(f"{tag}: the foreign target was not refused with the adopt command")
        if mode == "race" and (not stepped_aside(r) or r["loser_confirmed_after_the_failover"]):
            bad.append(f"{tag}: the loser exited {r['loser_exit']} / delivered "
                       f"{r['loser_confirmed_after_the_failover']}")
        if mode == "sync" and r["start_exit"] != 0:
            bad.append(f"{tag}: start exited {r['start_exit']}")
    return bad


def run_mode(mode: str, sizes: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    seed = args.seed
    rounds: list[dict[str, Any]] = []
    if mode == "async-lag":
        n = args.leads or sizes["lag_leads"]
        for i in range(args.rounds or sizes["lag_rounds"]):
            for variant in _chosen(args, ("after-intake", "during-lag")):
                rounds.append(lag_round(i, n, sizes["callers"], variant, seed,
                                        sizes["lag_intake_seconds"]))
                _progress(mode, rounds[-1])
    elif mode == "sqlite":
        n = args.leads or sizes["sqlite_leads"]
        for i in range(args.rounds or sizes["sqlite_rounds"]):
            for how in _chosen(args, ("emptied", "deleted", "restored")):
                rounds.append(sqlite_round(i, n, how, seed, sizes["sqlite_callers"]))
                _progress(mode, rounds[-1])
    elif mode == "race":
        n = args.leads or sizes["race_leads"]
        for i in range(args.rounds or sizes["race_rounds"]):
            rounds.append(race_round(i, n, seed))
            _progress(mode, rounds[-1])
    else:
        n = args.leads or sizes["sync_leads"]
        moments = _chosen(args, ("intake", "delivery"))
        for i in range(args.failovers or sizes["sync_failovers"]):
            rounds.append(sync_round(i, n, sizes["callers"], seed, moments[i % len(moments)],
                                     args.batch_size))
            _progress(mode, rounds[-1])
    doc: dict[str, Any] = {"rounds": rounds, "totals": _totals(rounds),
                           "seconds": round(time.perf_counter() - started, 1)}
    if mode in ("sync", "async-lag"):
        doc["promotion_seconds"] = _stats([r["promotion_seconds"] for r in rounds])
    if mode == "sync":
        doc["failover_seconds"] = _stats([r["failover_seconds"] for r in rounds
                                          if r["failover_seconds"] is not None])
        doc["pair_make_seconds"] = _stats([r["pair_seconds"] for r in rounds])
        doc["failovers"] = len(rounds)
    if mode == "async-lag":
        lagged = [r for r in rounds if r["variant"] == "during-lag"]
        doc["lost_acknowledged_during_lag"] = sum(r["lost_acknowledged"] for r in lagged)
        doc["acknowledged_after_last_replay"] = sum(r["acknowledged_after_last_replay"]
                                                    for r in lagged)
        doc["warning_before_the_cut"] = rounds[0]["replication_before_cut"]
    doc["violations"] = verdict(mode, rounds)
    doc["ok"] = not doc["violations"]
    return doc


def _chosen(args: argparse.Namespace, every: tuple[str, ...]) -> tuple[str, ...]:
    """The variants of a mode to run (``--variants``: those of this mode that are named)."""
    if not args.variants:
        return every
    named = tuple(v for v in every if v in args.variants.split(","))
    return named or every


def _progress(mode: str, r: dict[str, Any]) -> None:
    what = r.get("variant") or r.get("how") or r.get("moment") or r.get("winner") or ""
    print(f"  {mode} round {r['round']} {what}: {r['rows_at_target']} rows for "
          f"{r['leads_in_store']} leads in the store, duplicated {r['duplicated']}, lost "
          f"acknowledged {r['lost_acknowledged']}, uncertain {r['uncertain']}, unsettled "
          f"{r['unsettled']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench forget",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, 1 round (2 failovers for sync); no results file")
    parser.add_argument("--rounds", type=int, help="rounds (async-lag, sqlite, race)")
    parser.add_argument("--failovers", type=int, help="failovers of the sync mode")
    parser.add_argument("--leads", type=int, help="leads per round (default: per mode)")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--variants",
                        help="comma-separated, of the modes run: after-intake,during-lag "
                             "(async-lag); emptied,deleted,restored (sqlite); intake,delivery "
                             "(sync: the moment of the kill); default: all")
    parser.add_argument("--batch-size", type=int,
                        help="sync: start's --batch-size (default: runner's, 1000)")
    parser.add_argument("--json", help="also write the document to this file")
    args = parser.parse_args(argv)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    if any(m != "sqlite" for m in modes):
        from harness.pgcluster import unavailable

        reason = unavailable()
        if reason is not None:
            print(f"bench forget: no PostgreSQL pair can be made here: {reason}",
                  file=sys.stderr)
            return 2
    sizes = SIZES["quick" if args.quick else "full"]
    started = time.perf_counter()
    found: dict[str, Any] = {}
    for mode in modes:
        print(f"{mode}:", flush=True)
        found[mode] = run_mode(mode, sizes, args)
    seconds = time.perf_counter() - started
    ok = all(doc["ok"] for doc in found.values())
    doc = {"modes": found, "ok": ok, "seed": args.seed, "quick": args.quick,
           "seconds": round(seconds, 1), "machine_summary": machine()}
    print(f"\nstore memory campaigns ({', '.join(modes)}; {machine()}; {seconds:.0f} s)")
    for mode, each in found.items():
        t = each["totals"]
        print(f"{mode:<10} rounds {len(each['rounds']):>3}  duplicated {t['duplicated']}  "
              f"lost acknowledged {t['lost_acknowledged']}  unsettled {t['unsettled']}  "
              f"uncertain {t['uncertain']}  {'PASS' if each['ok'] else 'FAIL'}")
        for key_ in ("promotion_seconds", "failover_seconds"):
            if each.get(key_):
                print(f"{'':<10} {key_}: median {each[key_]['median']} s, max "
                      f"{each[key_]['max']} s")
        for v in each["violations"]:
            print(f"VIOLATION {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if not args.quick:
        record("forget", doc, script="-m bench forget", argv=argv)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
