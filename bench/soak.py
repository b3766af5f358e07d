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
``bench/results/soak-<UTC timestamp>-<backend>.json``.  The report, its ceilings and its
summary are ``bench/soak_report.py``; what a sample reads, ``bench/soak_probes.py``.
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
from dataclasses import asdict
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
from bench.soak_probes import (  # noqa: E402
    open_files,
    proc_rss_mib,
    relation_sizes,
    size_mib,
    vacuum_without_autovacuum,
)
from bench.soak_report import CEILINGS, Report, Sample, growth_per_lead, summary  # noqa: E402
from harness.invariants import audit, is_postgres, query  # noqa: E402

RUN = str(ROOT / "run.py")
RESULTS = ROOT / "bench" / "results"
SCOPE = {"tenant_id": "soak-tenant", "account_id": "soak-account", "page_id": "soak-page",
         "form_id": "soak-form"}
WORKERS = "raw-retriever,core-processor,generic-materializer,domain-projector"
STATUSES = ("contacted", "qualified", "won", "lost", "new")
FINAL_STATES = {"confirmed", "uncertain", "confirmed_then_missing"}

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


# -- the run: the worker, its load, its kills, the samples ------------------------------

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
            wal = size_mib(Path(f"{path}-wal"))
            store = size_mib(path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        counts = query(self.db, "SELECT (SELECT count(*) FROM {t}outbox), "
                                "(SELECT count(*) FROM {t}leads)")
        outbox, leads = (int(counts[0][0]), int(counts[0][1])) if counts else (0, 0)
        return Sample(round(t, 1), self.life, round(proc_rss_mib(pid), 1) if pid else 0.0,
                      open_files(pid) if pid else 0, round(wal, 2), round(store, 2),
                      outbox, leads, round(size_mib(self.stderr_path), 3),
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
        stderr_mib = size_mib(self.stderr_path)
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
