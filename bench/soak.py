"""Endurance run (issue 15, point 12): a worker under steady load for a long time, killed
with SIGKILL now and then, sampled for growth, and audited for loss and duplicates.

    python -m bench soak --minutes 30 --backend sqlite      # the documented run
    python -m bench soak --minutes 30 --backend postgres
    python -m bench soak --quick                            # ~16 s, what CI runs

What runs, all at once, for ``--minutes``:

* a feeder process accepts new leads at ``--rate`` per second (the library's ``accept``,
  one commit per answer; it prints each acknowledged key, flushed, so only answered keys
  count as accepted);
* status churn: ``--churn`` target rows per second get a new business ``status``, so the
  worker's poll passes observe changes (``status_changed`` events, the funnel moves);
* the worker: ``run.py start --workers raw-retriever,core-processor,generic-materializer,
  domain-projector``, SIGKILLed every ``--kill-every`` seconds and started again at once;
* retention (unless ``--no-retention``): every ``--retention-every`` seconds ``run.py
  outbox export --after W --commit-watermark`` (the NDJSON is checked to continue exactly
  after W, with no gap), ``run.py outbox prune --before W+1``, then ``run.py pipeline
  prune --before AGE`` (``--pipeline-keep``, default 60s: the pipeline's finished
  per-event records and its history older than that).

Every ``--sample-every`` seconds it records the worker's RSS, its open file descriptors,
the WAL size (SQLite), the store size (SQLite: file + WAL + shm; PostgreSQL: the total
relation size of the store's schema), outbox rows, pipeline rows (records, work rows and
both histories) and the worker's stderr size.

What bounds the store: with retention on, the outbox and the pipeline's per-event rows
stay within a few minutes' worth; what remains grows with the leads themselves (each
lead's record, which is never deleted, and its current D3 and D4 records).  So the
store's ceiling is on its growth per lead, ``store_growth_kib_per_lead``: (store size at
the end - store size at the first sample past a third of the run) / (leads accepted in
between), which leaves out fixed costs (a WAL that is checkpointed but not truncated,
PostgreSQL's first extents).  It does not apply without retention (``--no-retention``),
nor in ``--quick`` (too short for the retention window to reach its steady state).
On PostgreSQL, deleted rows become free space only once vacuumed: when the
server's ``autovacuum`` is off (as on the test machine), the soak runs ``VACUUM`` on the
store's tables after each retention pass, as autovacuum would (``pg_vacuum`` in the
report).

At the end the feeder stops, the worker is stopped, ``start --cycles 2`` completes the
work and the audit of ``bench/invariants.py`` runs: every acknowledged lead is in the
store and final (confirmed, uncertain or confirmed_then_missing), no lead has two target
rows, every confirmed lead has exactly one.  Exit 1 on any loss, duplicate or violation,
or when a sample passes a ceiling (``CEILINGS``).  Without ``--quick`` the figures go to
``bench/results/soak-<UTC timestamp>-<backend>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaos_lane import (  # noqa: E402
    add_backend_arguments,
    drop_postgres_schema,
    postgres_location,
)
from harness.invariants import audit, is_postgres, query  # noqa: E402

RUN = str(ROOT / "run.py")
RESULTS = ROOT / "bench" / "results"
SCOPE = {"tenant_id": "soak-tenant", "account_id": "soak-account", "page_id": "soak-page",
         "form_id": "soak-form"}
WORKERS = "raw-retriever,core-processor,generic-materializer,domain-projector"
STATUSES = ("contacted", "qualified", "won", "lost", "new")
FINAL_STATES = {"confirmed", "uncertain", "confirmed_then_missing"}

#: the ceilings a sample may not pass (any sample, any worker life)
CEILINGS = {
    "rss_mib": 160.0,        # the worker's resident set
    "open_files": 64,        # its open file descriptors
    "wal_mib": 64.0,         # SQLite's -wal file
    "store_growth_kib_per_lead": 4.0,  # with retention on (see above)
}
#: the growth ceiling applies once this many leads came in after its first sample
PER_LEAD_FROM = 1000


@dataclass
class Sample:
    t: float
    life: int
    rss_mib: float
    open_files: int
    wal_mib: float
    store_mib: float
    outbox_rows: int
    leads: int
    stderr_mib: float
    pipeline_rows: int = 0


@dataclass
class Report:
    backend: str
    minutes: float
    quick: bool
    rate: float
    churn: float
    kill_every: float
    retention: bool
    started_at: str = ""
    machine: str = ""
    ceilings: dict[str, float] = field(default_factory=lambda: dict(CEILINGS))
    samples: list[Sample] = field(default_factory=list)
    kills: int = 0
    accepted: int = 0
    confirmed: int = 0
    uncertain: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    exports: int = 0
    exported_events: int = 0
    pruned_events: int = 0
    export_gaps: int = 0
    pipeline_keep: str = ""
    pipeline_prunes: int = 0
    pipeline_removed: dict[str, int] = field(default_factory=dict)
    pipeline_rows_at_end: int = 0
    pipeline_prune_seconds_max: float = 0.0
    store_kib_per_lead: float = 0.0
    store_growth_kib_per_lead: float | None = None
    pg_vacuum: bool = False
    #: PostgreSQL: each table's size at the end (MiB: heap with TOAST, its indexes; live
    #: and dead rows), to tell kept rows from bloat when the store grows
    relation_sizes: dict[str, dict[str, float]] = field(default_factory=dict)
    outbox_rows_at_end: int = 0
    outbox_last_seq: int = 0
    store_mib_at_end: float = 0.0
    stderr_mib_per_min: float = 0.0
    violations: list[str] = field(default_factory=list)
    ok: bool = False


# -- the feeder (a child process) --------------------------------------------------------

def feed(db: str, scope_path: str, rate: float, prefix: str) -> None:
    """Accept leads at ``rate`` per second until SIGTERM; one flushed line per answer."""
    import anyio

    from runner import DurableWorker
    from runner.errors import StoreError

    scope = json.loads(Path(scope_path).read_text(encoding="utf-8"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    async def go() -> None:
        async with DurableWorker(db, scope) as worker:
            started, i = time.monotonic(), 0
            while not stop.is_set():
                due = started + i / rate
                if (wait := due - time.monotonic()) > 0:
                    await anyio.sleep(wait)
                key = f"{prefix}-{i:08d}"
                try:
                    result = await worker.accept({**scope, "source": "meta",
                                                  "source_lead_id": key, "synthetic": True,
                                                  "contact_alias": f"synthetic-{i}"})
                except StoreError as exc:  # a client retries the same key: not answered
                    sys.stderr.write(f"feeder: {key}: {exc}; retrying\n")
                    await anyio.sleep(0.5)
                    continue
                if result.result in ("accepted", "duplicate"):
                    sys.stdout.write(key + "\n")
                    sys.stdout.flush()
                i += 1

    anyio.run(go)


# -- sampling ----------------------------------------------------------------------------

def _proc_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _size_mib(*paths: Path) -> float:
    return sum(p.stat().st_size for p in paths if p.exists()) / (1 << 20)


class Soak:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.dir = Path(tempfile.mkdtemp(prefix="runner-soak-"))
        os.chmod(self.dir, 0o700)
        self.pg = args.backend == "postgres"
        self.db = (postgres_location(args.pg_dsn, f"soak_{os.getpid()}_{int(time.time())}")
                   if self.pg else str(self.dir / "queue.db"))
        self.target = self.dir / "target.db"
        self.scope = self.dir / "scope.json"
        self.scope.write_text(json.dumps(SCOPE), encoding="utf-8")
        self.stderr_path = self.dir / "worker.stderr"
        self.stdout_path = self.dir / "worker.stdout"
        self.acked_path = self.dir / "acked.txt"
        self.export_path = self.dir / "export.ndjson"
        self.worker: subprocess.Popen[bytes] | None = None
        self.life = 0
        self.watermark = 0
        self.stop = threading.Event()

    def env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_CRASH")}

    def cli(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, RUN, *argv], capture_output=True, text=True,
                              env=self.env(), timeout=timeout, check=False)

    def start_worker(self, *extra: str) -> subprocess.Popen[bytes]:
        self.life += 1
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            return subprocess.Popen(
                [sys.executable, RUN, "start", "--db", self.db, "--scope", str(self.scope),
                 "--target", str(self.target), "--interval", str(self.args.interval),
                 "--poll-limit", "1000", "--workers", WORKERS, *extra],
                stdout=out, stderr=err, env=self.env())

    def sample(self, t: float) -> Sample:
        pid = self.worker.pid if self.worker and self.worker.poll() is None else 0
        if self.pg:
            from runner.io.postgres.dsn import parse

            rows = query(self.db, "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) "
                         "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                         "WHERE n.nspname = ? AND c.relkind = 'r'", parse(self.db).schema)
            store = int(rows[0][0]) / (1 << 20) if rows else 0.0
            wal = 0.0
        else:
            path = Path(self.db)
            wal = _size_mib(Path(f"{path}-wal"))
            store = _size_mib(path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        counts = query(self.db, "SELECT (SELECT count(*) FROM {t}outbox), "
                                "(SELECT count(*) FROM {t}leads)")
        outbox, leads = (int(counts[0][0]), int(counts[0][1])) if counts else (0, 0)
        return Sample(round(t, 1), self.life, round(_proc_rss_mib(pid), 1) if pid else 0.0,
                      _open_files(pid) if pid else 0, round(wal, 2), round(store, 2),
                      outbox, leads, round(_size_mib(self.stderr_path), 3),
                      self.pipeline_rows())

    def pipeline_rows(self) -> int:
        rows = query(self.db, "SELECT (SELECT count(*) FROM {t}pipeline_records) "
                              "+ (SELECT count(*) FROM {t}pipeline_work) "
                              "+ (SELECT count(*) FROM {t}pipeline_history) "
                              "+ (SELECT count(*) FROM {t}pipeline_outcome_history)")
        return int(rows[0][0]) if rows else 0

    # -- status churn: the CRM changes statuses (a thread) -----------------------------

    def churn(self) -> None:
        rng = random.Random(self.args.seed)
        step = 0.25
        per_step = max(1, round(self.args.churn * step))
        conn: sqlite3.Connection | None = None
        while not self.stop.wait(step):
            if not self.target.exists():
                continue
            try:
                if conn is None:
                    conn = sqlite3.connect(self.target, timeout=30, isolation_level=None)
                top = conn.execute("SELECT max(row_id) FROM sheet").fetchone()[0]
                if not top:
                    continue
                ids = [(rng.choice(STATUSES), rng.randint(1, top)) for _ in range(per_step)]
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("UPDATE sheet SET status = ? WHERE row_id = ?", ids)
                conn.execute("COMMIT")
            except sqlite3.Error:
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
        if conn is not None:
            conn.close()

    # -- retention ---------------------------------------------------------------------

    def retention(self) -> None:
        proc = self.cli("outbox", "export", "--db", self.db, "--after", str(self.watermark),
                        "--limit", "1000000", "--commit-watermark")
        if proc.returncode != 0:
            self.report.violations.append(f"export exited {proc.returncode}: "
                                          f"{proc.stderr.strip()[-300:]}")
            return
        expected = self.watermark + 1
        lines = proc.stdout.splitlines()
        for line in lines:
            seq = json.loads(line)["seq"]
            if seq != expected:
                self.report.export_gaps += 1
                self.report.violations.append(f"export: seq {seq} where {expected} was due")
                return
            expected += 1
        with open(self.export_path, "a", encoding="utf-8") as out:
            out.write(proc.stdout)
        self.report.exports += 1
        self.report.exported_events += len(lines)
        self.watermark = expected - 1
        pruned = self.cli("outbox", "prune", "--db", self.db,
                          "--before", str(self.watermark + 1))
        if pruned.returncode != 0:
            self.report.violations.append(f"prune exited {pruned.returncode}: "
                                          f"{pruned.stderr.strip()[-300:]}")
            return
        self.report.pruned_events += int(json.loads(pruned.stdout)["pruned"])
        began = time.monotonic()
        pipeline = self.cli("pipeline", "prune", "--db", self.db,
                            "--before", self.args.pipeline_keep)
        took = time.monotonic() - began
        self.report.pipeline_prune_seconds_max = round(
            max(self.report.pipeline_prune_seconds_max, took), 2)
        print(f"  pipeline prune: {took:.1f} s {pipeline.stdout.strip()[-160:]}", flush=True)
        if pipeline.returncode != 0:
            self.report.violations.append(f"pipeline prune exited {pipeline.returncode}: "
                                          f"{pipeline.stderr.strip()[-300:]}")
            return
        self.report.pipeline_prunes += 1
        for kind, n in json.loads(pipeline.stdout)["removed"].items():
            self.report.pipeline_removed[kind] = self.report.pipeline_removed.get(kind, 0) + n
        if self.pg:
            self.report.pg_vacuum = vacuum_without_autovacuum(self.db) or \
                self.report.pg_vacuum

    def retain(self, started: float) -> None:
        """Retention every ``--retention-every`` seconds, in a thread of its own: a slow
        pass (a VACUUM on a loaded server) never delays the samples or the kills."""
        due = started + self.args.retention_every
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            try:
                self.retention()
            except Exception as exc:  # recorded, and the run goes on
                self.report.violations.append(f"retention: {type(exc).__name__}: {exc}")
            due += self.args.retention_every

    # -- the run ---------------------------------------------------------------------

    def run(self) -> None:
        args, report = self.args, self.report
        # create the store (and pin scope and target) before the feeder races the worker
        first = self.cli("once", "--db", self.db, "--scope", str(self.scope),
                         "--target", str(self.target))
        if first.returncode != 0:
            report.violations.append(f"first once exited {first.returncode}: "
                                     f"{first.stderr.strip()[-300:]}")
            return
        with open(self.acked_path, "wb") as acked:
            feeder = subprocess.Popen(
                [sys.executable, "-m", "bench.soak", "feed", self.db, str(self.scope),
                 str(args.rate), "soak"], stdout=acked, cwd=ROOT, env=self.env())
        churner = threading.Thread(target=self.churn, daemon=True)
        churner.start()
        self.worker = self.start_worker()
        started = time.monotonic()
        end = started + args.minutes * 60
        next_sample = started
        next_kill = started + args.kill_every
        feeder_gone = False
        retainer = threading.Thread(target=self.retain, args=(started,), daemon=True)
        if args.retention:
            retainer.start()
        try:
            while (now := time.monotonic()) < end:
                if now >= next_sample:
                    report.samples.append(self.sample(now - started))
                    s = report.samples[-1]
                    print(f"  t={s.t:>7.0f}s life={s.life} rss={s.rss_mib:.0f}MiB "
                          f"fds={s.open_files} wal={s.wal_mib:.1f}MiB "
                          f"store={s.store_mib:.1f}MiB outbox={s.outbox_rows} "
                          f"leads={s.leads} stderr={s.stderr_mib:.2f}MiB", flush=True)
                    next_sample += args.sample_every
                if feeder.poll() is not None and not feeder_gone:
                    feeder_gone = True
                    report.violations.append(f"the feeder exited ({feeder.returncode}) at "
                                             f"t={now - started:.0f}s")
                if now >= next_kill:
                    assert self.worker is not None
                    if self.worker.poll() is not None:
                        report.violations.append(
                            f"the worker exited by itself ({self.worker.returncode}): "
                            f"{self.stderr_tail()}")
                    else:
                        os.kill(self.worker.pid, signal.SIGKILL)
                        self.worker.wait(timeout=60)
                        report.kills += 1
                    self.worker = self.start_worker()
                    next_kill += args.kill_every
                time.sleep(min(0.2, max(0.0, min(next_sample, next_kill) - time.monotonic())))
        finally:
            feeder.send_signal(signal.SIGTERM)
            try:
                feeder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                feeder.kill()
            self.stop.set()
            churner.join(timeout=60)
            if retainer.is_alive():
                retainer.join(timeout=900)
            if self.worker is not None and self.worker.poll() is None:
                self.worker.send_signal(signal.SIGTERM)
                try:
                    self.worker.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    self.worker.kill()
                    self.worker.wait()
        report.samples.append(self.sample(time.monotonic() - started))
        self.finish(time.monotonic() - started)

    def finish(self, seconds: float) -> None:
        report = self.report
        final = self.start_worker("--cycles", "2")
        if final.wait(timeout=900) != 0:
            report.violations.append(f"the completing run exited {final.returncode}")
        acked = set(self.acked_path.read_text(encoding="utf-8").split())
        report.accepted = len(acked)
        end = audit(self.db, self.target, accepted=acked, in_flight_ok=False)
        report.violations += [v for v in end.violations
                              if not v.startswith(("lost", "duplicated", "unexpected"))]
        states = {str(k): str(v) for k, v in
                  query(self.db, "SELECT source_lead_id, state FROM {t}leads")}
        report.confirmed = end.states["confirmed"]
        report.uncertain = end.states["uncertain"]
        report.duplicated = sum(1 for n in end.rows.values() if n > 1)
        report.unexpected = len(set(end.rows) - end.keys)
        report.lost = sum(1 for key in acked if states.get(key) not in FINAL_STATES)
        no_row = [k for k, s in states.items() if s == "confirmed" and end.rows.get(k) != 1]
        if no_row:
            report.violations.append(f"{len(no_row)} confirmed leads without exactly one row")
        last = query(self.db, "SELECT count(*), coalesce(max(seq), 0) FROM {t}outbox")
        report.outbox_rows_at_end, report.outbox_last_seq = int(last[0][0]), int(last[0][1])
        report.store_mib_at_end = report.samples[-1].store_mib if report.samples else 0.0
        report.pipeline_rows_at_end = self.pipeline_rows()
        if self.pg:
            report.relation_sizes = relation_sizes(self.db)
        if report.accepted:
            report.store_kib_per_lead = round(report.store_mib_at_end * 1024
                                              / report.accepted, 2)
        stderr_mib = _size_mib(self.stderr_path)
        report.stderr_mib_per_min = round(stderr_mib / max(seconds / 60, 1e-9), 3)
        for s in report.samples:
            for name, ceiling in CEILINGS.items():
                if name == "store_growth_kib_per_lead":
                    continue
                if getattr(s, name) > ceiling:
                    report.violations.append(
                        f"ceiling: {name} = {getattr(s, name)} > {ceiling} at t={s.t}s")
        report.store_growth_kib_per_lead = growth_per_lead(report.samples, seconds / 3)
        growth, ceiling = report.store_growth_kib_per_lead, CEILINGS[
            "store_growth_kib_per_lead"]
        if report.retention and not report.quick and growth is not None and growth > ceiling:
            report.violations.append(f"ceiling: store_growth_kib_per_lead = {growth} > "
                                     f"{ceiling}")
        report.ok = (not report.violations and report.lost == report.duplicated
                     == report.unexpected == 0)

    def stderr_tail(self) -> str:
        """The worker's last error lines (why it exited by itself)."""
        with open(self.stderr_path, "rb") as err:
            err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
            lines = err.read().decode("utf-8", "replace").splitlines()
        errors = [line for line in lines if "ERROR" in line or "error" in line]
        return " | ".join((errors or lines)[-3:])[-600:]

    def cleanup(self) -> None:
        if self.report.ok:
            if self.pg:
                drop_postgres_schema(self.db)
            shutil.rmtree(self.dir, ignore_errors=True)


def growth_per_lead(samples: list[Sample], after: float) -> float | None:
    """KiB of store per lead accepted between the first sample at or past ``after``
    seconds and the last one; None with fewer than ``PER_LEAD_FROM`` leads between."""
    first = next((s for s in samples if s.t >= after), None)
    last = samples[-1] if samples else None
    if first is None or last is None or last.leads - first.leads < PER_LEAD_FROM:
        return None
    return round((last.store_mib - first.store_mib) * 1024 / (last.leads - first.leads), 2)


def vacuum_without_autovacuum(location: str) -> bool:
    """``VACUUM`` the store's tables when the server's autovacuum is off (what it would
    do); True if it ran."""
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> bool:
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            if await conn.fetchval("SHOW autovacuum") == "on":
                return False
            tables = await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
                where.schema)
            for (name,) in tables:
                await conn.execute(f"VACUUM {where.schema_ident}.\"{name}\"")
            return True
        finally:
            await conn.close()

    return asyncio.run(go())


def relation_sizes(location: str) -> dict[str, dict[str, float]]:
    """Each table of the store's schema: MiB of heap (with TOAST) and of indexes, live and
    dead rows (the server's statistics), largest first."""
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> dict[str, dict[str, float]]:
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            rows = await conn.fetch(
                "SELECT c.relname, pg_total_relation_size(c.oid) - pg_indexes_size(c.oid), "
                "pg_indexes_size(c.oid), coalesce(s.n_live_tup, 0), "
                "coalesce(s.n_dead_tup, 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE n.nspname = $1 AND c.relkind = 'r' "
                "ORDER BY pg_total_relation_size(c.oid) DESC", where.schema)
        finally:
            await conn.close()
        mib = 1024 * 1024
        return {str(name): {"heap_mib": round(heap / mib, 2), "index_mib": round(index / mib, 2),
                            "live_rows": int(live), "dead_rows": int(dead)}
                for name, heap, index, live, dead in rows}

    return asyncio.run(go())


def summary(report: Report) -> str:
    lives: dict[int, float] = {}
    for s in report.samples:
        lives[s.life] = max(lives.get(s.life, 0.0), s.rss_mib)
    first = report.samples[0] if report.samples else None
    last = report.samples[-1] if report.samples else None
    lines = [
        f"soak ({report.backend}, {report.minutes:g} min, {report.rate:g} leads/s, "
        f"{report.churn:g} status changes/s, kill -9 every {report.kill_every:g} s, "
        f"retention {'on' if report.retention else 'off'})",
        f"  accepted {report.accepted}  confirmed {report.confirmed}  uncertain "
        f"{report.uncertain}  lost {report.lost}  duplicated {report.duplicated}  "
        f"unexpected {report.unexpected}  kills {report.kills}",
        "  peak RSS per worker life (MiB): "
        + " ".join(f"{v:.0f}" for v in lives.values()),
        f"  max RSS {max((s.rss_mib for s in report.samples), default=0):.1f} MiB, "
        f"max open files {max((s.open_files for s in report.samples), default=0)}, "
        f"max WAL {max((s.wal_mib for s in report.samples), default=0):.1f} MiB",
    ]
    if first and last:
        lines.append(f"  store {first.store_mib:.1f} -> {last.store_mib:.1f} MiB; outbox rows "
                     f"{first.outbox_rows} -> {last.outbox_rows} (last seq "
                     f"{report.outbox_last_seq}); stderr {report.stderr_mib_per_min:.3f} "
                     f"MiB/min")
        if report.accepted:
            lines.append(f"  store per accepted lead: "
                         f"{last.store_mib * (1 << 20) / report.accepted / 1024:.2f} KiB; "
                         f"growth per lead after the first third: "
                         f"{report.store_growth_kib_per_lead} KiB"
                         f"{' (VACUUM after each retention pass)' if report.pg_vacuum else ''}")
    if report.retention:
        lines.append(f"  exports {report.exports} ({report.exported_events} events, "
                     f"{report.export_gaps} gaps), pruned {report.pruned_events}")
        lines.append(f"  pipeline prunes {report.pipeline_prunes} (--before "
                     f"{report.pipeline_keep}, the longest "
                     f"{report.pipeline_prune_seconds_max:.1f} s): removed "
                     f"{report.pipeline_removed}; "
                     f"pipeline rows at the end {report.pipeline_rows_at_end}")
    for name, size in list(report.relation_sizes.items())[:8]:
        lines.append(f"  {name}: heap {size['heap_mib']:.1f} MiB, indexes "
                     f"{size['index_mib']:.1f} MiB, rows {size['live_rows']:.0f} live / "
                     f"{size['dead_rows']:.0f} dead")
    lines += [f"  VIOLATION {v}" for v in report.violations]
    lines.append(f"result: {'PASS' if report.ok else 'FAIL'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["feed"]:
        feed(argv[1], argv[2], float(argv[3]), argv[4])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true",
                        help="~25 s with fast sampling and kills; writes no results file")
    parser.add_argument("--rate", type=float, default=50.0, help="leads accepted per second")
    parser.add_argument("--churn", type=float, default=20.0, help="status changes per second")
    parser.add_argument("--kill-every", type=float, default=300.0)
    parser.add_argument("--sample-every", type=float, default=30.0)
    parser.add_argument("--retention-every", type=float, default=60.0)
    parser.add_argument("--no-retention", dest="retention", action="store_false")
    parser.add_argument("--pipeline-keep", default="60s", metavar="AGE",
                        help="pipeline prune --before AGE at each retention (default 60s)")
    parser.add_argument("--interval", type=float, default=0.5, help="start --interval")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--json", help="write the report here (default: bench/results/, "
                                       "not in --quick)")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes = min(args.minutes, 0.25)  # 15 s: two kills, two prunes (the CI budget)
        args.kill_every = min(args.kill_every, 6.0)
        args.sample_every = min(args.sample_every, 2.0)
        args.retention_every = min(args.retention_every, 5.0)
        if args.pipeline_keep == "60s":
            args.pipeline_keep = "5s"
    report = Report(args.backend, args.minutes, args.quick, args.rate, args.churn,
                    args.kill_every, args.retention,
                    pipeline_keep=args.pipeline_keep,
                    started_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    machine=f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
                            f"SQLite {sqlite3.sqlite_version}")
    soak = Soak(args, report)
    print(f"soak: {soak.dir} ({'postgres' if is_postgres(soak.db) else 'sqlite'})",
          flush=True)
    try:
        soak.run()
    except Exception as exc:
        report.violations.append(f"harness: {type(exc).__name__}: {exc}")
        report.ok = False
    print(summary(report), flush=True)
    path = args.json or (None if args.quick else str(
        RESULTS / f"soak-{report.started_at.replace(':', '')}-{args.backend}.json"))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        doc = asdict(report)
        doc["kind"] = "soak"
        Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"written: {path}")
    soak.cleanup()
    if not report.ok:
        print(f"kept for inspection: {soak.dir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
