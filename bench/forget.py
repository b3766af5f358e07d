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
    exactly one holds the lock and delivers, the other steps aside (exit 75).
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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from bench.results import record  # noqa: E402

RUN = str(ROOT / "run.py")
SCOPE = {"tenant_id": "forget-tenant", "account_id": "forget-account",
         "page_id": "forget-page", "form_id": "forget-form"}
MODES = ("async-lag", "sqlite", "race", "sync")
CONFIRMS = {"batch.confirmed", "lead.confirmed", "batch.reconciled", "lead.reconciled"}
REWIND_ACTIONS = {"store.rewind", "store.fenced", "store.rewound", "batch.still_uncertain",
                  "store.rewind_read_failed"}
PENDING = ("prepared", "in_flight", "failed_safe")
#: sizes: (full, quick)
SIZES: dict[str, dict[str, int]] = {
    "full": {"lag_leads": 3000, "lag_rounds": 5, "sqlite_leads": 300, "sqlite_rounds": 4,
             "race_rounds": 5, "race_leads": 300, "sync_failovers": 20, "sync_leads": 2000,
             "callers": 4, "lag_intake_seconds": 8, "sqlite_callers": 2},
    "quick": {"lag_leads": 300, "lag_rounds": 1, "sqlite_leads": 60, "sqlite_rounds": 1,
              "race_rounds": 1, "race_leads": 60, "sync_failovers": 2, "sync_leads": 2000,
              "callers": 3, "lag_intake_seconds": 3, "sqlite_callers": 1},
}


# -- processes ----------------------------------------------------------------------------

def event(i: int) -> dict[str, Any]:
    return {**SCOPE, "source": "meta", "source_lead_id": f"lead-{i:06d}", "synthetic": True,
            "contact_alias": f"alias-{i}"}


def key(i: int) -> str:
    return f"lead-{i:06d}"


def cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, RUN, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=ROOT)


def json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
    return found


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)  # bench code: polling a condition, with a deadline


def ts(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00")).timestamp()


class Caller:
    """One ``runner accept --records -`` process fed its events on stdin, as a source
    does: the next event once the previous one is answered (at most ``rate`` a second; 0:
    as fast as the answers come); every answered line is an acknowledged event."""

    def __init__(self, db: str, scope: Path, ids: list[int], out: Path, rate: float) -> None:
        self.out = out
        self._err = open(f"{out}.err", "w", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [sys.executable, RUN, "accept", "--db", db, "--scope", str(scope), "--records",
             "-", "--log-format", "json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._err, text=True, cwd=ROOT)
        self.sent: list[int] = []
        self.answers: list[dict[str, Any]] = []
        self._answered = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._feeder = threading.Thread(target=self._feed, args=(ids, rate), daemon=True)
        self._feeder.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            found = json_lines(line)
            with self._answered:
                self.answers += found
                self._answered.notify_all()
        with self._answered:
            self._answered.notify_all()

    def _feed(self, ids: list[int], rate: float) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            for n, i in enumerate(ids):
                stdin.write(json.dumps(event(i)) + "\n")
                stdin.flush()
                self.sent.append(i)
                with self._answered:  # the answer, or the caller's end
                    while len(self.answers) <= n and self.proc.poll() is None:
                        self._answered.wait(0.05)
                if self.proc.poll() is not None:
                    return
                if rate:
                    time.sleep(1 / rate)  # the source's pace, not a wait for state
            stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the caller died (its server was killed): the rest is never sent

    def acked(self) -> set[str]:
        with self._answered:
            return {str(doc["source_lead_id"]) for doc in self.answers
                    if doc.get("result") in ("accepted", "duplicate")
                    and "source_lead_id" in doc}

    def finish(self, timeout: float = 300) -> int:
        self._feeder.join(timeout)
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout)
        self._err.close()
        return code

    @property
    def error(self) -> str:
        return Path(f"{self.out}.err").read_text()[-500:]


class Callers:
    """``n`` concurrent callers sharing ``ids`` round-robin."""

    def __init__(self, db: str, scope: Path, ids: list[int], n: int, work: Path,
                 rate: float = 0, tag: str = "c") -> None:
        self.each = [Caller(db, scope, ids[i::n], work / f"{tag}{i}.out", rate)
                     for i in range(n)]

    def acked(self) -> set[str]:
        return set().union(*(c.acked() for c in self.each))

    def finish(self) -> list[int]:
        return [c.finish() for c in self.each]


def accept_all(db: str, scope: Path, ids: list[int], n: int, work: Path,
               tag: str = "c") -> set[str]:
    callers = Callers(db, scope, ids, n, work, tag=tag)
    codes = callers.finish()
    if any(codes):
        raise RuntimeError(f"accept exited {codes}: {callers.each[0].error}")
    return callers.acked()


def records(db: str) -> dict[str, dict[str, Any]]:
    """Every record's state, read from the store with its own driver (a read, as
    ``bench/kill9.py`` reads it: no process per look)."""
    from harness.invariants import query

    return {str(k): {"state": str(s)} for k, s in query(
        db, "SELECT source_lead_id, state FROM {t}leads")}


def counts(db: str) -> dict[str, int]:
    from harness.invariants import query

    try:
        return {str(s): int(n) for s, n in query(
            db, "SELECT state, count(*) FROM {t}leads GROUP BY state")}
    except Exception:  # no writable host yet: not settled
        return {}


def settled(db: str) -> bool:
    found = counts(db)
    return bool(found) and not any(found.get(s) for s in PENDING)


def delivered(db: str) -> bool:
    """Every record confirmed.  Where nothing was lost (a synchronous pair) a ``start``
    that rides through ends there: ``settled`` alone is true already while the records
    it recovered at its reconnect are uncertain, before its next cycle reads them back
    (a round stopped then left 1,000 uncertain records with their rows at the target)."""
    found = counts(db)
    return bool(found) and all(s == "confirmed" for s, n in found.items() if n)


def target_rows(target: Path) -> Counter[tuple[str, str]]:
    """Rows at the synthetic target per (tenant, source_lead_id)."""
    if not target.exists():
        return Counter()
    with sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=10) as conn:
        try:
            return Counter((str(t), str(k)) for t, k in conn.execute(
                "SELECT tenant, source_lead_id FROM sheet"))
        except sqlite3.OperationalError:
            return Counter()


def said(lines: Iterable[dict[str, Any]], actions: set[str]) -> list[dict[str, Any]]:
    """The log lines runner wrote with these actions, without their timestamps."""
    return [{k: v for k, v in line.items() if k in ("level", "action", "message", "reason",
                                                     "count", "replication")}
            for line in lines if line.get("action") in actions]


def settle(db: str, scope: Path, target: Path, tries: int = 10) -> list[dict[str, Any]]:
    """``once`` until nothing is left to send; every log line of those runs."""
    lines: list[dict[str, Any]] = []
    for _ in range(tries):
        proc = cli("once", "--db", db, "--scope", scope, "--target", target,
                   "--log-format", "json", "--retry-base", "0")
        lines += json_lines(proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"once exited {proc.returncode}: {proc.stderr[-800:]}")
        if settled(db):
            return lines
    raise RuntimeError(f"still records to send after {tries} runs of once: {counts(db)}")


def audit(db: str, target: Path, acked: set[str]) -> dict[str, Any]:
    """What the target and the store hold at the end of a round."""
    rows = target_rows(target)
    kept = records(db)
    states = Counter(r["state"] for r in kept.values())
    at_target = {k for _, k in rows}
    return {
        "leads_in_store": len(kept),
        "rows_at_target": rows.total(),
        "duplicated": sum(1 for n in rows.values() if n > 1),
        "duplicated_rows": sum(n - 1 for n in rows.values() if n > 1),
        "acknowledged": len(acked),
        "lost_acknowledged": len(acked - set(kept)),
        "lost_acknowledged_delivered": len((acked - set(kept)) & at_target),
        "rows_for_leads_not_in_store": len(at_target - set(kept)),
        "confirmed": states["confirmed"],
        "uncertain": states["uncertain"],
        "uncertain_with_a_row": sum(1 for k, r in kept.items()
                                    if r["state"] == "uncertain" and k in at_target),
        "confirmed_without_a_row": sum(1 for k, r in kept.items()
                                       if r["state"] == "confirmed" and k not in at_target),
        "unsettled": sum(n for s, n in states.items() if s not in ("confirmed", "uncertain")),
    }


def scope_file(work: Path) -> Path:
    path = work / "scope.json"
    path.write_text(json.dumps(SCOPE))
    return path


# -- async-lag ----------------------------------------------------------------------------

def lag_round(index: int, n: int, callers: int, variant: str, seed: int,
              intake_seconds: float = 8) -> dict[str, Any]:
    from harness.pgpair import make_pair

    rng = random.Random(f"{seed}:lag:{variant}:{index}")
    work = Path(tempfile.mkdtemp(prefix="runner-forget-lag-"))
    pair = make_pair(synchronous=False)
    try:
        scope, target = scope_file(work), work / "t.db"
        db = pair.dsn(schema="forget")
        ids = list(range(n))
        result: dict[str, Any] = {"round": index, "variant": variant, "leads": n}
        if variant == "after-intake":
            acked = accept_all(db, scope, ids, callers, work)
            pair.wait_replayed()
            replayed: set[str] = set(acked)
            feeding = None
        else:  # the callers go on through the cut and the delivery, until the kill
            feeding = Callers(db, scope, ids, callers, work,
                              rate=n / callers / intake_seconds)
            wait(lambda: len(feeding.acked()) >= n // 3, 120, "a third acknowledged")
            replayed = feeding.acked()  # each answered after its commit: all replayed by
            pair.wait_replayed()        # the time the standby has the primary's WAL now
        before = json.loads(cli("status", "--db", db).stdout)["replication"]
        result["replication_before_cut"] = {"mode": before["mode"],
                                            "detail": before["detail"]}
        pair.lag()
        so_far = len(replayed) if feeding is None else len(feeding.acked())
        half = max(1, so_far // 2)
        deliver = cli("start", "--db", db, "--scope", scope, "--target", target,
                      "--cycles", "1", "--interval", "0", "--dispatch-limit", str(half),
                      "--log-format", "json")
        if deliver.returncode != 0:
            raise RuntimeError(f"start exited {deliver.returncode}: {deliver.stderr[-500:]}")
        lines = json_lines(deliver.stderr)
        banner = [x for x in lines if x.get("action") == "runner.started"]
        result["replication_during_cut"] = banner[0].get("replication") if banner else None
        result["warned_during_cut"] = said(lines, {"replication.at_risk"})
        result["delivered_before_failover"] = target_rows(target).total()
        if feeding is not None:  # a few more acknowledged while the stream is cut
            grown = len(feeding.acked()) + max(1, n // 10)
            wait(lambda: len(feeding.acked()) >= grown
                 or all(c.proc.poll() is not None for c in feeding.each), 120,
                 "more acknowledged during the cut")
        time.sleep(rng.uniform(0, 0.3))  # a random moment for the kill
        over = pair.failover()
        result["promotion_seconds"] = over["promotion_seconds"]
        if feeding is not None:
            feeding.finish()  # each exits 74 (connection lost) or 0 (had sent all)
            acked = feeding.acked()
            result["acknowledged_after_last_replay"] = len(acked - replayed)
            # a source sends again what was never acknowledged (new write_ids)
            unanswered = [i for i in ids if key(i) not in acked]
            accept_all(db, scope, unanswered, callers, work, tag="again")
            result["sent_again_unacknowledged"] = len(unanswered)
        lines = settle(db, scope, target)
        result["runner_said"] = said(lines, REWIND_ACTIONS)
        result.update(audit(db, target, acked))
        if feeding is not None:
            lost = acked - set(records(db))
            result["lost_outside_the_warned_window"] = len(lost & replayed)
        return result
    finally:
        pair.destroy()
        shutil.rmtree(work, ignore_errors=True)


# -- sqlite -------------------------------------------------------------------------------

def _sqlite_round(index: int, n: int, how: str, seed: int, callers: int = 2) -> dict[str, Any]:
    rng = random.Random(f"{seed}:sqlite:{how}:{index}")
    work = Path(tempfile.mkdtemp(prefix="runner-forget-sqlite-"))
    try:
        scope, target, db = scope_file(work), work / "t.db", work / "q.db"
        result: dict[str, Any] = {"round": index, "how": how, "leads": n}
        ids = list(range(n))

        def once(*extra: str) -> subprocess.CompletedProcess[str]:
            return cli("once", "--db", db, "--scope", scope, "--target", target,
                       "--log-format", "json", *extra)

        if how == "restored":
            accepted_at_copy = rng.randint(1, n)
            accept_all(str(db), scope, ids[:accepted_at_copy], callers, work, tag="a")
            delivered_at_copy = rng.randint(0, accepted_at_copy)
            if delivered_at_copy:
                once("--dispatch-limit", str(delivered_at_copy))
            copy = work / "backup.db"
            shutil.copyfile(db, copy)  # the store is closed between commands: one file
            accept_all(str(db), scope, ids[accepted_at_copy:], callers, work, tag="b")
            once()
            result.update(copy_after_accepted=accepted_at_copy,
                          copy_after_delivered=delivered_at_copy)
            for side in ("-wal", "-shm"):
                Path(f"{db}{side}").unlink(missing_ok=True)
            shutil.copyfile(copy, db)
        else:
            accept_all(str(db), scope, ids, callers, work, tag="a")
            delivered = rng.randint(1, n)
            once("--dispatch-limit", str(delivered))
            result["delivered_before_loss"] = delivered
            if how == "emptied":
                db.write_bytes(b"")
            else:
                db.unlink()
            for side in ("-wal", "-shm"):
                Path(f"{db}{side}").unlink(missing_ok=True)
        result["rows_before_reaccept"] = target_rows(target).total()
        acked = accept_all(str(db), scope, ids, callers, work, tag="again")  # the same events
        first = once()
        result["once_exit"] = first.returncode
        lines = json_lines(first.stderr)
        if first.returncode == 78:
            refusal = [x for x in lines if x.get("level") == "error"]
            result["refused"] = refusal[-1].get("message") if refusal else first.stderr[-400:]
            result["rows_after_refusal"] = target_rows(target).total()
            adopted = cli("target", "adopt", "--db", db, "--scope", scope, "--target",
                          target, "--reason", f"bench forget: the store was {how}")
            result["adopt_exit"] = adopted.returncode
            if adopted.returncode != 0:
                raise RuntimeError(f"target adopt exited {adopted.returncode}: "
                                   f"{adopted.stderr[-400:]}")
        elif first.returncode != 0:
            raise RuntimeError(f"once exited {first.returncode}: {first.stderr[-800:]}")
        if not settled(str(db)):
            lines += settle(str(db), scope, target)
        result["runner_said"] = said(lines, REWIND_ACTIONS)
        result.update(audit(str(db), target, acked))
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- race ---------------------------------------------------------------------------------

def _start(db: str, scope: Path, target: Path, log: Path, out: Path,
           *extra: str) -> subprocess.Popen[str]:
    with open(log, "w") as err, open(out, "w") as stdout:
        return subprocess.Popen(
            [sys.executable, RUN, "start", "--db", db, "--scope", str(scope), "--target",
             str(target), "--log-format", "json", *extra], stdout=stdout, stderr=err,
            stdin=subprocess.DEVNULL, text=True, cwd=ROOT, start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _confirmed(out: Path) -> int:
    return sum(int(doc.get("confirmed", 0)) + int(doc.get("reconciled", 0))
               for doc in json_lines(out.read_text()) if "confirmed" in doc)


def _running(proc: subprocess.Popen[str], log: Path) -> None:
    """Until ``start`` holds the lock and has said so (its ``runner.started`` line): a
    start that meets no writable host at its own start-up exits 74 at once, as one-shot
    commands do; riding through is for a running worker."""
    wait(lambda: proc.poll() is not None or '"runner.started"' in log.read_text(), 60,
         "start to hold the lock")
    if proc.poll() is not None:
        raise RuntimeError(f"start exited {proc.returncode}: {log.read_text()[-500:]}")


def race_round(index: int, n: int, seed: int) -> dict[str, Any]:
    from harness.pgpair import make_pair

    rng = random.Random(f"{seed}:race:{index}")
    work = Path(tempfile.mkdtemp(prefix="runner-forget-race-"))
    pair = make_pair(synchronous=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        scope, target = scope_file(work), work / "t.db"
        db = pair.dsn(schema="forget")
        acked = accept_all(db, scope, list(range(n)), 2, work)
        pace = ("--interval", "0.05", "--batch-size", "10", "--target-rate", "20/s")
        first = _start(db, scope, target, work / "first.log", work / "first.out", *pace)
        procs.append(first)
        wait(lambda: target_rows(target).total() >= 20, 60, "the first worker's batches")
        # the second is started a random moment before the kill: its start-up (about
        # half a second here) ends before, during or after the promotion, while the
        # first waits out its reconnect backoff
        # odd rounds: the first is stopped (SIGSTOP, a stalled host) across the failover
        # and resumed a random moment after the second started, so either may win
        stalled = index % 2 == 1
        lead = 0.0
        if stalled:
            os.kill(first.pid, signal.SIGSTOP)
            pair.failover()
            t_kill = time.time()
            second = _start(db, scope, target, work / "second.log", work / "second.out",
                            *pace)
            rows_at_second = target_rows(target).total()
            time.sleep(rng.uniform(0, 1.5))
            os.kill(first.pid, signal.SIGCONT)
        else:
            second = _start(db, scope, target, work / "second.log", work / "second.out",
                            *pace)
            lead = rng.uniform(0, 0.6)
            time.sleep(lead)
            rows_at_second = target_rows(target).total()
            t_kill = time.time()
            pair.failover()
        procs.append(second)
        wait(lambda: first.poll() is not None or second.poll() is not None, 120,
             "one of the two to step aside")
        loser_exited = round(time.time() - t_kill, 3)
        loser, winner, names = ((first, second, ("first", "second"))
                                if first.poll() is not None else
                                (second, first, ("second", "first")))
        loser_out = work / f"{names[0]}.out"
        loser_confirmed = _confirmed(loser_out)
        wait(lambda: delivered(db), 180, "the winner to deliver everything")
        code = _stop(winner)
        logs = {name: json_lines((work / f"{name}.log").read_text())
                for name in ("first", "second")}
        loser_line = [x for x in logs[names[0]] if x.get("level") == "error"]
        result = {"round": index, "leads": n, "winner": names[1],
                  "first_stalled_across_the_failover": stalled,
                  "second_started_before_the_kill": round(lead, 3),
                  "loser_exited_after_the_kill": loser_exited,
                  "loser_exit": loser.returncode, "winner_exit": code,
                  "loser_said": loser_line[-1].get("message") if loser_line else None,
                  "loser_confirmed_after_the_failover": (
                      loser_confirmed if names[0] == "second" else
                      _confirmed(loser_out) - loser_confirmed),
                  "rows_when_the_second_started": rows_at_second,
                  "runner_said": said(logs[names[1]], REWIND_ACTIONS | {"store.reconnected",
                                                                         "store.lost"})}
        result.update(audit(db, target, acked))
        return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        pair.destroy()
        shutil.rmtree(work, ignore_errors=True)


# -- sync ---------------------------------------------------------------------------------

def sync_round(index: int, n: int, callers: int, seed: int, moment: str,
               batch: int | None = None) -> dict[str, Any]:
    from harness.pgpair import make_pair

    rng = random.Random(f"{seed}:sync:{index}")
    sized = ("--batch-size", str(batch)) if batch else ()
    work = Path(tempfile.mkdtemp(prefix="runner-forget-sync-"))
    made = time.monotonic()
    pair = make_pair(synchronous=True)
    pair_seconds = time.monotonic() - made
    worker = None
    try:
        scope, target = scope_file(work), work / "t.db"
        db = pair.dsn(schema="forget")
        ids = list(range(n))
        # the default batch (1000); paced so that a kill during delivery finds batches
        # still to send
        pace = ("--interval", "0.05", "--target-rate", "4/s", *sized)
        if moment == "intake":
            feeding = Callers(db, scope, ids, callers, work, rate=n / callers / 4)
            wait(lambda: len(feeding.acked()) >= 1, 60, "the first acknowledgement")
            worker = _start(db, scope, target, work / "start.log", work / "start.out",
                            *pace)
            _running(worker, work / "start.log")
            time.sleep(rng.uniform(0, 2.0))  # a random moment during the intake
        else:
            acked0 = accept_all(db, scope, ids, callers, work)
            worker = _start(db, scope, target, work / "start.log", work / "start.out",
                            *pace[:2], "--target-rate", "1/s", *sized)
            wait(lambda: target_rows(target).total() >= 1, 60, "the first batch")
            time.sleep(rng.uniform(0, 1.0))  # a random moment during the delivery
        at_kill = target_rows(target).total()
        t_kill = time.time()
        killed = pair.kill_primary()
        promotion = pair.promote()
        del killed
        if moment == "intake":
            feeding.finish()
            acked = feeding.acked()
            unanswered = [i for i in ids if key(i) not in acked]
            accept_all(db, scope, unanswered, callers, work, tag="again")
        else:
            acked = acked0
            unanswered = []
        running = worker
        wait(lambda: running.poll() is not None or delivered(db), 300,
             "start to deliver everything through the new primary")
        code = _stop(worker)
        lines = json_lines((work / "start.log").read_text())
        back = next((i for i, x in enumerate(lines) if x.get("action") == "store.reconnected"
                     and x.get("task") == "start" and ts(x) > t_kill), None)
        first = (next((ts(x) for x in lines[back:] if x.get("action") in CONFIRMS), None)
                 if back is not None else None)
        result: dict[str, Any] = {
            "round": index, "moment": moment, "leads": n, "pair_seconds": round(pair_seconds, 3),
            "rows_at_kill": at_kill, "start_exit": code,
            "start_errors": [x.get("message") for x in lines if x.get("level") == "error"],
            "promotion_seconds": round(promotion, 3),
            "failover_seconds": round(first - t_kill, 3) if first is not None else None,
            "reconnect_attempts": int(lines[back].get("count", 0)) if back is not None else None,
            "sent_again_unacknowledged": len(unanswered),
            "replication_after": [x.get("replication") for x in lines
                                  if x.get("action") == "replication.after_reconnect"],
            "runner_said": said(lines, REWIND_ACTIONS | {"store.lost", "store.reconnected"}),
        }
        result.update(audit(db, target, acked))
        return result
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        pair.destroy()
        shutil.rmtree(work, ignore_errors=True)


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
        if mode == "race" and (r["loser_exit"] != 75 or r["loser_confirmed_after_the_failover"]):
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
                rounds.append(_sqlite_round(i, n, how, seed, sizes["sqlite_callers"]))
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
