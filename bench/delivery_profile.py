"""Where runner's delivery time goes (issue 32): a cProfile of ``once`` run in process, in
a child of its own, over N prepared leads (SQLite store, fresh synthetic target, the
default batch size), every thread profiled (the event loop's, aiosqlite's connection
thread, the dispatch run's worker thread), merged into one ``pstats`` file.

cProfile times every Python call and every call into C (SQLite's ``execute``, JSON,
pydantic's validation are entries of their own); its overhead per call lengthens
Python-heavy code more than C-heavy code, so the shares are a guide to where the time
goes, not a timing.  Each thread is summarised on its own: the dispatch run's worker
thread (the store's statement per batch, the target's write and readback, mapping and
judging) by every function, the event loop's thread (reading and parsing the pages of
records, the start, the poll pass) by runner's own functions: there cProfile loses track
of the outermost frames as coroutines suspend and resume, so its figures are looser.
"""

from __future__ import annotations

import json
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from bench.common import ROOT, SCOPE, workdir
from bench.leads import _prepare

#: the child: every thread gets a profiler of its own (``threading.setprofile`` installs
#: one as a thread starts), the main thread one around ``runner.cli.main``; once the other
#: threads have ended, the profiles are merged and dumped (argv[1]), and each thread's is
#: summarised (argv[2], JSON)
_CHILD = """
import cProfile, json, pstats, sys, threading
from runner.cli import main
from bench.delivery_profile import summarise
profiles = []
def start(frame, event, arg):
    p = cProfile.Profile()
    profiles.append((threading.current_thread().name, p))
    p.enable()  # replaces this hook in this thread
threading.setprofile(start)
mine = cProfile.Profile()
mine.enable()
code = main(sys.argv[3:])
mine.disable()
threading.setprofile(None)
for t in threading.enumerate():
    if t is not threading.main_thread():
        t.join(timeout=30)
threads = [("event loop", pstats.Stats(mine))]
threads += [(name, pstats.Stats(p)) for name, p in profiles]
merged = pstats.Stats(mine)
for _, p in profiles:
    merged.add(p)
merged.dump_stats(sys.argv[1])
with open(sys.argv[2], "w") as out:
    json.dump([summarise(name, stats) for name, stats in threads], out)
sys.exit(code)
"""

TOP = 15
#: the dispatch run's worker thread is the one that ran this (``runner.tasks.pagerun``)
_DISPATCH = ("tasks/pagerun.py", "run")


def _name(key: tuple[str, int, str]) -> str:
    path, line, func = key
    if path == "~":
        return func  # a built-in: {method 'execute' of 'sqlite3.Connection' objects}
    text = Path(path)
    try:
        shown = str(text.relative_to(ROOT))
    except ValueError:
        parts = text.parts
        shown = "/".join(parts[parts.index("site-packages") + 1:] if "site-packages" in parts
                         else parts[-2:])
    return f"{shown}:{line}({func})"


def summarise(name: str, stats: pstats.Stats) -> dict[str, Any]:
    """One thread's top functions by cumulative time: every function in a worker thread;
    in the event loop's thread runner's own (``runner/``), below the loop's machinery
    (whose figures include its waits)."""
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    table = stats.stats  # type: ignore[attr-defined]
    dispatch = any(k[0].endswith(_DISPATCH[0]) and k[2] == _DISPATCH[1] for k in table)
    keys = list(table)
    if name == "event loop":
        keys = [k for k in keys if k[0].startswith(str(ROOT / "runner"))]
    keys.sort(key=lambda k: table[k][3], reverse=True)

    def entry(key: tuple[str, int, str]) -> dict[str, Any]:
        _, calls, own, cumulative, _ = table[key]
        return {"function": _name(key), "calls": calls, "own_s": round(own, 4),
                "cumulative_s": round(cumulative, 4)}

    return {"thread": "dispatch (worker thread)" if dispatch else name,
            "dispatch": dispatch, "top": [entry(k) for k in keys[:TOP]]}


def profile_once(n: int, out: Path | None = None) -> dict[str, Any]:
    """``once`` over ``n`` prepared leads in a profiled child: each thread's summary, and
    the path of the merged ``pstats`` file (kept)."""
    if out is None:
        out = Path(tempfile.mkstemp(prefix="delivery-floor-", suffix=".prof")[1])
    with workdir() as d:
        db = d / "q.db"
        anyio.run(_prepare, db, None, n, False)
        scope = d / "scope.json"
        scope.write_text(json.dumps(SCOPE))
        summary = d / "threads.json"
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(out), str(summary), "once", "--db", str(db),
             "--scope", str(scope), "--target", str(d / "t.db"), "--log-format", "json"],
            capture_output=True, check=False, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"profiled once failed ({proc.returncode}): "
                               f"{proc.stderr[-500:]!r}")
        threads = json.loads(summary.read_text(encoding="utf-8"))
    confirmed = json.loads(proc.stdout)["confirmed"]
    if confirmed != n:
        raise RuntimeError(f"profiled once confirmed {confirmed} of {n}")
    return {"n": n, "file": str(out), "threads": threads}


def top_lines(profile: dict[str, Any]) -> list[str]:
    """The printout: the dispatch thread's top functions by cumulative time, then
    runner's own in the event loop's thread."""
    lines = [f"where runner's time goes: cProfile of once in process, {profile['n']:,} "
             f"leads, SQLite store, every thread ({profile['file']})"]
    shown = sorted((t for t in profile["threads"] if t["dispatch"] or
                    t["thread"] == "event loop"), key=lambda t: not t["dispatch"])
    for thread in shown:
        lines.append(f"  {thread['thread']}, by cumulative time:")
        lines.append(f"    {'cumulative':>10} {'own':>8} {'calls':>8}  function")
        for e in thread["top"]:
            lines.append(f"    {e['cumulative_s']:>9.3f}s {e['own_s']:>7.3f}s "
                         f"{e['calls']:>8,}  {e['function']}")
    return lines
