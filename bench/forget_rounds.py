"""One round of each mode of the store-memory campaigns (``bench/forget.py``, whose
docstring says what each mode does and what must hold): ``lag_round`` (async-lag),
``sqlite_round``, ``race_round`` and ``sync_round``.  Each makes its own work directory
(and its own PostgreSQL pair), runs the round as an operator meets it, and returns what it
counted, with the audit of ``bench/forget_kit.py``."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.forget_kit import (
    Callers,
    accept_all,
    audit,
    cli,
    confirmed_in,
    counts,
    delivered,
    json_lines,
    key,
    records,
    said,
    scope_file,
    settle,
    settled,
    start_worker,
    stop_worker,
    target_rows,
    ts,
    wait,
    wait_running,
)

CONFIRMS = {"batch.confirmed", "lead.confirmed", "batch.reconciled", "lead.reconciled"}
REWIND_ACTIONS = {"store.rewind", "store.fenced", "store.rewound", "batch.still_uncertain",
                  "store.rewind_read_failed"}


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

def sqlite_round(index: int, n: int, how: str, seed: int, callers: int = 2) -> dict[str, Any]:
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
        first = start_worker(db, scope, target, work / "first.log", work / "first.out", *pace)
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
            second = start_worker(db, scope, target, work / "second.log", work / "second.out",
                                  *pace)
            rows_at_second = target_rows(target).total()
            time.sleep(rng.uniform(0, 1.5))
            os.kill(first.pid, signal.SIGCONT)
        else:
            second = start_worker(db, scope, target, work / "second.log", work / "second.out",
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
        loser_confirmed = confirmed_in(loser_out)
        with contextlib.suppress(TimeoutError):  # judged just below, with both logs
            wait(lambda: delivered(db) or winner.poll() is not None, 180,
                 "the winner to deliver everything")
        if winner.poll() is not None or not delivered(db):
            # the round cannot be judged: say what each of the two did
            tails = {name: (work / f"{name}.log").read_text()[-1500:]
                     for name in ("first", "second")}
            raise RuntimeError(
                f"race round {index}: the winner ({names[1]}) "
                + (f"exited {winner.returncode}" if winner.poll() is not None else
                   "is running") + f" before every record was confirmed {counts(db)}; "
                f"the loser ({names[0]}) exited {loser.returncode}; logs: {tails}")
        code = stop_worker(winner)
        logs = {name: json_lines((work / f"{name}.log").read_text())
                for name in ("first", "second")}
        loser_line = [x for x in logs[names[0]] if x.get("level") == "error"]
        result = {"round": index, "leads": n, "winner": names[1], "loser": names[0],
                  "first_stalled_across_the_failover": stalled,
                  "second_started_before_the_kill": round(lead, 3),
                  "loser_exited_after_the_kill": loser_exited,
                  "loser_exit": loser.returncode, "winner_exit": code,
                  "loser_said": loser_line[-1].get("message") if loser_line else None,
                  "loser_confirmed_after_the_failover": (
                      loser_confirmed if names[0] == "second" else
                      confirmed_in(loser_out) - loser_confirmed),
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
            worker = start_worker(db, scope, target, work / "start.log", work / "start.out",
                                  *pace)
            wait_running(worker, work / "start.log")
            time.sleep(rng.uniform(0, 2.0))  # a random moment during the intake
        else:
            acked0 = accept_all(db, scope, ids, callers, work)
            worker = start_worker(db, scope, target, work / "start.log", work / "start.out",
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
        code = stop_worker(worker)
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
