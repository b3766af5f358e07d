"""Where a pipelined dispatch's time goes (issue 32): ``once --dispatch-pipeline on`` over
N prepared leads (SQLite store, fresh synthetic target, the default batch size), run in
process in a child of its own with timers around the steps of each batch, no profiler.

Per batch, the child times, with ``time.perf_counter``:

* ``request``: the request path, in the dispatch run's thread (``BatchRun._send``:
  mapping the records, the target's write, its readback, judging each row);
* ``commit``: the commit beside it, in a thread of its own (``BatchRun._commit``: the
  outcomes of the request before and the next batch's in-flight mark, one transaction of
  two statements), and inside it ``statement`` (the outcomes' ``UPDATE``, and the mark's
  first SQLite step, where its rows change), ``returning`` (the rest of the mark's steps:
  its RETURNING rows) and ``fsync`` (its ``COMMIT``);
* ``waited``: how long the dispatch thread then waited for that commit
  (``_Beside.result``): the part of the commit the request did not cover;
* ``pace``: the run's whole time over its batches.

The timers wrap runner's own methods (patched in the child only); they cost a few
microseconds a batch.  The same statement is timed alone, in a child of its own before the
run, on a copy of the store (``alone``): what it costs with no other thread running.  Beside
it, in the same rounds, the statement is timed with groups of the schema's row triggers
dropped inside its rolled-back transaction (``without``): what each part of the per-row
work costs (the kept counts; the outbox event; the guards; every trigger the statement
fires).  Those copies break the contract on purpose and are thrown away; they say where
the statement's time goes, not what runner could run.

What the statement's share is worth to the run is measured too (``untriggered``): pairs
of the same pipelined ``once`` (as a whole child process, its rate over its dispatch span
from its log), one on a copy of the prepared store as it is and one on a copy with every
trigger the statement fires dropped, the order alternating between pairs.  The ratio of
the two medians is what the whole run would gain if its row triggers cost nothing.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from bench.common import ROOT, SCOPE, workdir
from bench.leads import _prepare, once_rates

#: the child: argv[1] the store, argv[2] the scope file, argv[3] the target
_CHILD = """
import json, sys, threading, time
from collections import defaultdict
import runner.tasks.pagerun as pr
import runner.io.sqlite.delivery as dl
from runner.cli import main

spent = defaultdict(float)
count = defaultdict(int)

def timed(name, call):
    def wrapper(*args, **kw):
        started = time.perf_counter()
        try:
            return call(*args, **kw)
        finally:
            spent[name] += time.perf_counter() - started
            count[name] += 1
    return wrapper

pr.BatchRun._send = timed("request", pr.BatchRun._send)
pr.BatchRun._commit = timed("commit", pr.BatchRun._commit)
pr._Beside.result = timed("waited", pr._Beside.result)
pr.PipelinedBatchRun.run = timed("run", pr.PipelinedBatchRun.run)

class Conn:
    # the blocking steps' connection, its batch step split into its first step, its
    # RETURNING rows and its COMMIT
    def __init__(self, conn):
        self._conn = conn
    def execute(self, sql, *args):
        started = time.perf_counter()
        cursor = self._conn.execute(sql, *args)
        if sql is dl._FINISH_BATCH:  # the outcomes' half: counted with the mark's
            spent["statement"] += time.perf_counter() - started
        if sql is dl._BATCH_STEP:
            spent["statement"] += time.perf_counter() - started
            count["statement"] += 1
            return Rows(cursor)
        if sql == "COMMIT":
            spent["fsync"] += time.perf_counter() - started
            count["fsync"] += 1
        return cursor
    def __getattr__(self, name):
        return getattr(self._conn, name)

class Rows:
    def __init__(self, cursor):
        self._cursor = cursor
    def fetchall(self):
        started = time.perf_counter()
        rows = self._cursor.fetchall()
        spent["returning"] += time.perf_counter() - started
        count["returning"] += 1
        return rows

steps_init = dl.BlockingDispatchSteps.__init__
def init(self, conn, path):
    steps_init(self, Conn(conn), path)
dl.BlockingDispatchSteps.__init__ = init

code = main(["once", "--db", sys.argv[1], "--scope", sys.argv[2], "--target", sys.argv[3],
             "--dispatch-pipeline", "on", "--log-level", "warning"])
batches = count["request"]
print(json.dumps({"code": code, "batches": batches,
                  "per_batch_ms": {name: round(spent[name] / max(count[name], 1) * 1e3, 2)
                                   for name in spent if name != "run"},
                  "pace_ms": round(spent["run"] / max(batches, 1) * 1e3, 2)}))
"""

#: the row triggers the batch statement fires (an UPDATE of a lead's state, and the outbox
#: event it inserts), grouped as the spans table names them; ``all`` is every one of them
#: (the child checks the list against the store's schema, so a renamed or added trigger
#: fails the benchmark instead of going unmeasured)
_COUNTS = ("lead_counts_state", "outbox_counted")
_EVENT = ("leads_state_changed",)
_GUARDS = ("leads_transition_guard", "leads_resend_needs_decision")
TRIGGER_GROUPS: dict[str, tuple[str, ...]] = {
    "counts": _COUNTS, "event": _EVENT, "guards": _GUARDS,
    "all": (*_COUNTS, *_EVENT, *_GUARDS, "leads_uncertain_since"),
}

#: how the printout names each group dropped
WITHOUT = {"counts": "the kept counts' triggers", "event": "the outbox event's trigger",
           "guards": "the guards' triggers", "all": "every trigger it fires"}

#: the statement alone, on a copy of the store: the batch step of 1,000 outcomes then
#: 1,000 marks (its two statements, as the blocking steps run them) in BEGIN IMMEDIATE ...
#: ROLLBACK, no other thread (argv[1] the copy, argv[2] TRIGGER_GROUPS as JSON); each
#: round times the whole schema and then each group dropped, in turn
_ALONE = """
import json, re, sqlite3, statistics, sys, time
from runner.io.sqlite.delivery import _BATCH_STEP, _FINISH_BATCH
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
groups = json.loads(sys.argv[2])
# what the statement fires: an UPDATE trigger on leads of any column or of one it sets,
# and an INSERT trigger on the outbox (the event's row)
sets = {"state", "attempts", "updated_at", "next_attempt_at", "last_error", "last_failure"}
def fires(sql):
    on_leads = re.search(r"UPDATE(?:\\s+OF\\s+([\\w\\s,]+?))?\\s+ON\\s+leads\\b", sql, re.I)
    if on_leads:
        return (on_leads.group(1) is None
                or bool(sets & {c.strip() for c in on_leads.group(1).split(",")}))
    return re.search(r"INSERT\\s+ON\\s+outbox\\b", sql, re.I) is not None
fired = {name for (name, sql) in conn.execute(
    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'") if fires(sql)}
assert fired == set(groups["all"]), ("the statement fires", sorted(fired))
ids = [w for (w,) in conn.execute(
    "SELECT write_id FROM leads WHERE state = 'prepared' ORDER BY seq LIMIT 2000")]
def step(done, outcomes, marks):
    params = {"done": json.dumps(done), "outcomes": json.dumps(outcomes),
              "now": "2026-12-01T00:00:00.000000Z", "retry_at": None, "reason": None,
              "failure": None}
    conn.execute(_FINISH_BATCH, params)
    finished = conn.execute("SELECT changes()").fetchone()[0]
    return [None] * finished + conn.execute(_BATCH_STEP, {
        **params, "done": "[]", "outcomes": "[]", "next": json.dumps(marks)}).fetchall()
times = {name: [] for name in ["", *groups]}
for _ in range(7):
    for name in times:
        conn.execute("BEGIN IMMEDIATE")
        for trigger in groups.get(name, ()):
            conn.execute(f"DROP TRIGGER {trigger}")
        step([], [], ids[:1000])
        started = time.perf_counter()
        rows = step(ids[:1000], ["confirmed"] * 1000, ids[1000:])
        times[name].append(time.perf_counter() - started)
        conn.execute("ROLLBACK")
        assert len(rows) == 2000, len(rows)
ms = {name: round(statistics.median(t) * 1e3, 2) for name, t in times.items()}
print(json.dumps({"alone_ms": ms.pop(""), "without_ms": ms}))
"""


def _child(code: str, *argv: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline spans child failed ({proc.returncode}): "
                           f"{proc.stderr[-500:]!r}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def pipeline_spans(n: int, pairs: int = 3) -> dict[str, Any]:
    """The per-batch spans of one pipelined ``once`` over ``n`` prepared leads, the batch
    statement alone on a copy of the same store, and ``pairs`` pairs of pipelined runs
    with and without the statement's row triggers (``untriggered``)."""
    with workdir() as d:
        db = d / "q.db"
        anyio.run(_prepare, db, None, n, False)
        prepared = db.read_bytes()
        copy = d / "copy.db"
        copy.write_bytes(prepared)
        alone = _child(_ALONE, str(copy), json.dumps(TRIGGER_GROUPS))
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        untriggered = _untriggered(d, prepared, n, scope, pairs)
        found = _child(_CHILD, str(db), str(scope), str(d / "t.db"))
    if found["code"] != 0:
        raise RuntimeError(f"the spanned once exited {found['code']}")
    return {"n": n, **found, **alone, "untriggered": untriggered}


def _untriggered(d: Path, prepared: bytes, n: int, scope: Path, pairs: int
                 ) -> dict[str, Any]:
    """Pairs of pipelined ``once`` runs over copies of one prepared store: as it is, and
    with ``TRIGGER_GROUPS["all"]`` dropped; each run to a fresh target."""
    rates: dict[str, list[float]] = {"runner_per_s": [], "untriggered_per_s": []}
    for pair in range(pairs):
        order = ("runner_per_s", "untriggered_per_s")
        for key in order if pair % 2 == 0 else order[::-1]:
            run = d / f"run-{pair}-{key}"
            run.mkdir()
            (run / "q.db").write_bytes(prepared)
            if key == "untriggered_per_s":
                conn = sqlite3.connect(run / "q.db", isolation_level=None)
                try:
                    for trigger in TRIGGER_GROUPS["all"]:
                        conn.execute(f"DROP TRIGGER {trigger}")
                finally:
                    conn.close()
            rates[key].append(once_rates(
                ["--db", str(run / "q.db"), "--scope", str(scope), "--target",
                 str(run / "t.db"), "--dispatch-pipeline", "on"], n)[0])
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {"pairs": pairs, **medians,
            "ratio": medians["untriggered_per_s"] / medians["runner_per_s"],
            "rounds": {k: [round(x) for x in v] for k, v in rates.items()}}


def span_lines(spans: dict[str, Any]) -> list[str]:
    """The printout."""
    ms = spans["per_batch_ms"]
    lines = [f"where a pipelined batch's time goes (once in process, {spans['n']:,} leads, "
            f"{spans['batches']} batches, SQLite store; ms per batch): pace "
            f"{spans['pace_ms']:.1f}; request {ms.get('request', 0):.1f} beside commit "
            f"{ms.get('commit', 0):.1f} (statement {ms.get('statement', 0):.1f}, "
            f"RETURNING rows {ms.get('returning', 0):.1f}, fsync {ms.get('fsync', 0):.1f}); "
            f"waited for the commit {ms.get('waited', 0):.1f}; the statement with its "
            f"RETURNING rows alone (rolled back) {spans['alone_ms']:.1f}"
            + "".join(f"; without {WITHOUT[group]} {value:.1f}"
                      for group, value in spans.get("without_ms", {}).items())]
    untriggered = spans.get("untriggered")
    if untriggered:
        lines.append(
            f"the same pipelined once without every trigger the statement fires (a copy "
            f"of the store, {untriggered['pairs']} pairs, dispatch spans): "
            f"{untriggered['untriggered_per_s']:,.0f}/s against "
            f"{untriggered['runner_per_s']:,.0f}/s as made, "
            f"{untriggered['ratio']:.2f}x")
    return lines
