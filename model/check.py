"""Check the SPIN model of the delivery protocol (``model/delivery.pml``).

Why: tests sample executions; a model checker explores every interleaving of a small
model.  This script is the whole check, in CI and by hand: every property must verify
with no errors in an exhaustive search, and every mutation (a one-line change to the
model that breaks one guarantee) must yield a counterexample — a model in which the
mutations went unnoticed would prove nothing.

    python model/check.py                 # what CI runs (about a minute on 2 cores)
    python model/check.py --record        # and write bench/results/spin-<UTC>.json
    python model/check.py --deep          # and the liveness search at N=3, and the
                                          # pipelined dispatch's other targets (minutes;
                                          # --record writes spin-deep-<UTC>.json)
    python model/check.py --quick         # small bounds only (what the pytest run uses)
    python model/check.py --list          # the checks, without running them

Each check copies the model into a temporary directory, generates the verifier with
``spin -a`` (the configuration's bounds and the mutation as ``-D`` macros), compiles it
with ``cc`` and runs it for one named property (``pan -N``).  A verification passes only
when the search completed (no depth or memory bound was hit) with ``errors: 0``; a
mutation passes when SPIN reports an error for the property it names.  The figures
(states, transitions, depth, memory, times) are SPIN's own output, parsed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = HERE / "delivery.pml"

if str(ROOT) not in sys.path:  # run as a script (python model/check.py)
    sys.path.insert(0, str(ROOT))
from model.tables import (  # noqa: E402  (the tables: properties, bounds, mutations)
    CONFIGS,
    DEDUPE_ONLY,
    GUARANTEES,
    LIVENESS,
    MUTATIONS,
    PROPERTIES,
    SAFETY,
    mutation_config,
)

STEPS = HERE / "steps.toml"
#: the crash points that belong to delivery (the model must name every one of them)
DELIVERY_POINTS = ("accept.", "recover.", "reconcile.", "dispatch.")


def load_steps() -> list[dict[str, Any]]:
    """The model-to-code table (``model/steps.toml``)."""
    import tomllib

    with STEPS.open("rb") as f:
        steps: list[dict[str, Any]] = tomllib.load(f)["step"]
    return steps


def point_name(macro_arg: str) -> str:
    """``dispatch_after_in_flight`` -> ``dispatch.after-in-flight``."""
    head, _, rest = macro_arg.strip().partition("_")
    return f"{head}.{rest.replace('_', '-')}"


def model_crash_points(text: str | None = None) -> set[str]:
    """Every crash point the model names in a ``CRASH(...)`` (``a / b``: both)."""
    text = MODEL.read_text(encoding="utf-8") if text is None else text
    found: set[str] = set()
    for arg in re.findall(r"\bCRASH\(([^)]*)\)", text):
        if arg.strip() == "point":
            continue  # the macro's own definition
        found.update(point_name(a) for a in arg.split("/"))
    return found


def ltl_formulas(text: str | None = None) -> dict[str, str]:
    """The model's named LTL formulas, as written (macros unexpanded)."""
    text = MODEL.read_text(encoding="utf-8") if text is None else text
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^ltl (\w+)\s*\{(.*)\}\s*$", text, re.M)}


def property_macros(text: str | None = None) -> dict[str, str]:
    """The per-record predicates the formulas use (``#define NAME(i) ...``)."""
    text = MODEL.read_text(encoding="utf-8") if text is None else text
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^#define ([A-Z_]+)\(i\)\s+(.*)$", text, re.M)}


@dataclass(frozen=True)
class Check:
    config: str
    prop: str
    mutation: str | None = None

    @property
    def expect(self) -> str:
        return "counterexample" if self.mutation else "verified"

    @property
    def name(self) -> str:
        return f"{self.config}:{self.prop}" + (f"+{self.mutation}" if self.mutation else "")


@dataclass
class Outcome:
    """What one check saw: SPIN's own figures, parsed from its output."""

    check: str
    config: str
    property: str
    mutation: str | None
    expect: str
    result: str = "error"  # verified | counterexample | incomplete | error
    ok: bool = False
    errors: int | None = None
    states_stored: int | None = None
    states_visited: int | None = None
    transitions: int | None = None
    depth: int | None = None
    memory_mb: float | None = None
    compile_s: float = 0.0
    search_cpu_s: float = 0.0
    search_wall_s: float = 0.0
    detail: str = ""
    output: str = field(default="", repr=False)


class Unavailable(RuntimeError):
    """spin or a C compiler is missing."""


def tools() -> tuple[str, str]:
    """The spin and C compiler executables; Unavailable if either is missing."""
    spin = shutil.which("spin")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if spin is None or cc is None:
        missing = [name for name, path in (("spin", spin), ("a C compiler (cc)", cc))
                   if path is None]
        raise Unavailable(f"{' and '.join(missing)} not found on PATH "
                          "(Debian: apt-get install spin gcc)")
    return spin, cc


def spin_version(spin: str) -> str:
    out = subprocess.run([spin, "-V"], capture_output=True, text=True, check=False).stdout
    return out.strip()


def checks_for(*, quick: bool = False, deep: bool = False) -> list[Check]:
    """The checks of a run, in the order they are reported."""
    plain_liveness = [p for p in LIVENESS if p not in DEDUPE_ONLY]
    if quick:
        found = [Check("small", p) for p in PROPERTIES if p not in DEDUPE_ONLY]
        found += [Check("small-dedupe", p) for p in (*SAFETY, *DEDUPE_ONLY)]
        # the store that forgets: its liveness search costs more than the rest of --quick
        found += [Check("small-rewind", p) for p in SAFETY]
        found += [Check("small-pipeline", p) for p in SAFETY]
    else:
        found = [Check(c, p) for c in ("today", "batches", "dedupe") for p in SAFETY]
        found += [Check(c, p) for c in ("today-n2", "batches-n2") for p in plain_liveness]
        found += [Check("dedupe-live", p) for p in DEDUPE_ONLY]
        # a store that forgets (REWIND=1): every property but the deduplicating target's
        # in one verifier; never two rows again with a crash on top
        found += [Check("rewind", p) for p in (*SAFETY, *plain_liveness)]
        found += [Check("rewind-crash", "no_duplicate_write")]
        # the pipelined dispatch (PIPELINE=1, issue 32): two batches in flight at once;
        # the five safety properties, settling, and never two rows beside a store that
        # forgets, with a crash; the other targets and batch sizes with --deep
        found += [Check("pipeline", p) for p in SAFETY]
        found += [Check("pipeline-n2", p) for p in plain_liveness]
        found += [Check("pipeline-rewind-crash", "no_duplicate_write")]
        # the PostgreSQL store's step apart (SPLIT=1, issue 32): the outcomes and the next
        # mark in two transactions, either first, serial and pipelined; settling
        # pipelined; and beside a store that forgets (REWIND=1): every property serially,
        # never two rows pipelined with a crash on top.  Serial settling and a
        # deduplicating target's records all confirmed with --deep
        found += [Check(c, p) for c in ("split", "pipeline-split") for p in SAFETY]
        found += [Check("pipeline-split-n2", p) for p in plain_liveness]
        found += [Check("split-rewind", p) for p in (*SAFETY, *plain_liveness)]
        found += [Check("pipeline-split-rewind-crash", "no_duplicate_write")]
        if deep:
            found += [Check("split-n2", p) for p in plain_liveness]
            found += [Check("pipeline-split-dedupe-live", p) for p in DEDUPE_ONLY]
            found += [Check("batches-deep", p) for p in plain_liveness]
            found += [Check("dedupe-deep", p) for p in DEDUPE_ONLY]
            found += [Check(c, p) for c in ("pipeline-batches", "pipeline-dedupe")
                      for p in SAFETY]
            found += [Check("pipeline-dedupe-live", p) for p in DEDUPE_ONLY]
            found += [Check("pipeline-rewind", p) for p in (*SAFETY, *plain_liveness)]
    found += [Check(mutation_config(m, quick=quick), m.breaks, m.macro) for m in MUTATIONS]
    return found


def _timed(cmd: Sequence[str], cwd: Path, timeout: float) -> tuple[int, str, float, float]:
    """Run ``cmd``; (exit status, output, CPU seconds of the child, wall seconds)."""
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        if wall > timeout:
            raise TimeoutError(f"{' '.join(cmd)} took {wall:.0f} s (limit {timeout:.0f} s)")
        out.seek(0)
        return proc.returncode, out.read(), usage.ru_utime + usage.ru_stime, wall


def _number(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text)
    return float(match.group(1)) if match else None


def parse(outcome: Outcome, text: str) -> None:
    """Fill ``outcome`` from pan's report."""
    errors = _number(r"errors: (\d+)", text)
    stored = _number(r"([\d.e+]+) states, stored", text)
    visited = _number(r"states, stored \(([\d.e+]+) visited\)", text)
    trans = _number(r"([\d.e+]+) transitions \(", text)
    depth = _number(r"depth reached (\d+)", text)
    memory = _number(r"([\d.]+)\s+total actual memory usage", text)
    outcome.errors = int(errors) if errors is not None else None
    outcome.states_stored = int(stored) if stored is not None else None
    outcome.states_visited = int(visited) if visited is not None else None
    outcome.transitions = int(trans) if trans is not None else None
    outcome.depth = int(depth) if depth is not None else None
    outcome.memory_mb = memory
    truncated = ("max search depth too small" in text or "reached -DMEMLIM" in text
                 or "out of memory" in text)
    if outcome.errors is None:
        outcome.result, outcome.detail = "error", "no verdict in pan's output"
    elif outcome.errors > 0:
        outcome.result = "counterexample"
    elif truncated or "Search not completed" in text:
        outcome.result, outcome.detail = "incomplete", "the search hit a bound"
    else:
        outcome.result = "verified"
    outcome.ok = outcome.result == outcome.expect


def run_group(config: str, mutation: str | None, props: Sequence[str], *,
              spin: str, cc: str, keep: bool = False, timeout: float = 900.0,
              extra: str = "") -> list[Outcome]:
    """Generate and compile one verifier (a configuration, maybe a mutation), then run
    each property on it.  ``extra``: model text appended to the copy (a test's own
    ``ltl`` formula, say, which the model's tables do not list)."""
    cfg = CONFIGS[config]
    defines = [f"-D{k}={v}" for k, v in cfg.defines.items()]
    if mutation:
        defines.append(f"-D{mutation}")
    liveness = any(p in LIVENESS for p in props)
    outcomes = [Outcome(Check(config, p, mutation).name, config, p, mutation,
                        Check(config, p, mutation).expect) for p in props]
    work = Path(tempfile.mkdtemp(prefix="runner-spin-"))
    try:
        shutil.copy(MODEL, work / MODEL.name)
        if extra:
            with (work / MODEL.name).open("a", encoding="utf-8") as f:
                f.write("\n" + extra + "\n")
        t0 = time.monotonic()
        gen = subprocess.run([spin, *defines, "-a", MODEL.name], cwd=work,
                             capture_output=True, text=True, check=False)
        if gen.returncode != 0 or not (work / "pan.c").exists():
            for o in outcomes:
                o.detail = "spin -a failed: " + (gen.stdout + gen.stderr).strip()[-2000:]
            return outcomes
        # a verification searches up to millions of states: optimise; a mutation stops at
        # its first counterexample, and the small bounds search little: compile fast
        cflags = ["-O2"] if mutation is None and not config.startswith("small") else ["-O0"]
        if liveness:
            cflags.append("-DNFAIR=3")
        comp = subprocess.run([cc, *cflags, "-w", "-o", "pan", "pan.c"], cwd=work,
                              capture_output=True, text=True, check=False)
        compile_s = time.monotonic() - t0
        if comp.returncode != 0:
            for o in outcomes:
                o.detail = "cc failed: " + comp.stderr.strip()[-2000:]
            return outcomes
        for o in outcomes:
            o.compile_s = round(compile_s, 2)
            flags = ["-m1000000"] + (["-a", "-f"] if o.property in LIVENESS else [])
            _, text, cpu, wall = _timed(["./pan", *flags, "-N", o.property], work, timeout)
            o.search_cpu_s, o.search_wall_s = round(cpu, 2), round(wall, 2)
            o.output = text
            parse(o, text)
            if o.result == "counterexample" and not o.ok:
                o.detail = replay(spin, defines, o.property, work)
        return outcomes
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def replay(spin: str, defines: Sequence[str], prop: str, work: Path, lines: int = 80) -> str:
    """The counterexample's steps, as ``spin -t`` replays them (the last ``lines``; the
    trail names its claim, ``prop``)."""
    out = subprocess.run([spin, *defines, "-t", "-p", "-g", MODEL.name], cwd=work,
                         capture_output=True, text=True, check=False).stdout
    return "\n".join(out.splitlines()[-lines:])


def run(checks: Sequence[Check], *, jobs: int = 2, keep: bool = False,
        report: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run ``checks`` (grouped by verifier, ``jobs`` verifiers at a time)."""
    spin, cc = tools()
    groups: dict[tuple[str, str | None], list[str]] = {}
    for c in checks:
        groups.setdefault((c.config, c.mutation), []).append(c.prop)
    # the longest groups first, so that two jobs finish together
    order = sorted(groups, key=lambda g: (g[1] is not None, g[0].startswith("small")))
    done: dict[str, Outcome] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_group, g[0], g[1], groups[g], spin=spin, cc=cc, keep=keep)
                   for g in order]
        for future in futures:
            for outcome in future.result():
                done[outcome.check] = outcome
                if report:
                    report(outcome)
    return [done[c.name] for c in checks]


def line(o: Outcome) -> str:
    states = f"{o.states_stored:,}" if o.states_stored is not None else "?"
    if o.states_visited:
        states += f" ({o.states_visited:,} visited)"
    verdict = "ok  " if o.ok else "FAIL"
    return (f"{verdict} {o.check:<58} {o.result:<15} states {states:<28} "
            f"search {o.search_cpu_s:>6.1f} s cpu {o.search_wall_s:>6.1f} s wall")


def summary(outcomes: Sequence[Outcome], wall: float, *, jobs: int,
            spin: str) -> dict[str, Any]:
    """The machine-written record of a run (bench/results/spin-<UTC>.json)."""
    model_text = MODEL.read_bytes()
    used = sorted({o.config for o in outcomes})
    return {
        "ok": all(o.ok for o in outcomes),
        "model": str(MODEL.relative_to(ROOT)),
        "model_sha256": hashlib.sha256(model_text).hexdigest(),
        "spin": spin_version(spin),
        "jobs": jobs,
        "seconds": round(wall, 1),
        "configs": {name: {"what": CONFIGS[name].what, **CONFIGS[name].defines}
                    for name in used},
        "guarantees": {p: GUARANTEES[p] for p in PROPERTIES},
        "mutations": [asdict(m) for m in MUTATIONS],
        "checks": [{k: v for k, v in asdict(o).items() if k != "output"}
                   for o in outcomes],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small bounds only")
    mode.add_argument("--deep", action="store_true", help="add the liveness search at N=3")
    parser.add_argument("--only", help="run the checks whose name contains this text")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--record", action="store_true",
                        help="write bench/results/spin-<UTC>.json")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    args = parser.parse_args(argv)
    if args.record and (args.quick or args.only):
        parser.error("--record keeps whole runs only (not --quick or --only)")
    checks = checks_for(quick=args.quick, deep=args.deep)
    if args.only:
        checks = [c for c in checks if args.only in c.name]
    if args.list:
        for c in checks:
            print(f"{c.name}  (expect {c.expect})")
        return 0
    try:
        spin, _ = tools()
    except Unavailable as exc:
        print(f"model/check.py: {exc}", file=sys.stderr)
        return 2
    print(f"{spin_version(spin)}; {len(checks)} checks, {args.jobs} jobs", flush=True)
    start = time.monotonic()
    outcomes = run(checks, jobs=args.jobs, keep=args.keep,
                   report=lambda o: print(line(o), flush=True))
    wall = time.monotonic() - start
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        print(f"\n--- {o.check}: expected {o.expect}, got {o.result} {o.detail}\n"
              f"{o.output[-3000:]}", file=sys.stderr)
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} checks as expected in "
          f"{wall:.0f} s", flush=True)
    if args.record:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from bench.results import record

        record("spin-deep" if args.deep else "spin",
               summary(outcomes, wall, jobs=args.jobs, spin=spin),
               script="model/check.py", argv=argv)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
