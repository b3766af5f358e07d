"""The processes and the audit of the store-memory campaigns (``bench/forget.py``):
``runner`` commands as real processes (``cli``; ``accept`` callers fed on stdin, each
answered line an acknowledged event; ``start`` workers in their own process groups), what
the store and the target hold (read with their own drivers, no process per look), and the
round's audit: duplicated rows, lost acknowledged events, records left unsettled."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN = str(ROOT / "run.py")
SCOPE = {"tenant_id": "forget-tenant", "account_id": "forget-account",
         "page_id": "forget-page", "form_id": "forget-form"}
PENDING = ("prepared", "in_flight", "failed_safe")


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


# -- start workers ------------------------------------------------------------------------

def start_worker(db: str, scope: Path, target: Path, log: Path, out: Path,
                 *extra: str) -> subprocess.Popen[str]:
    with open(log, "w") as err, open(out, "w") as stdout:
        return subprocess.Popen(
            [sys.executable, RUN, "start", "--db", db, "--scope", str(scope), "--target",
             str(target), "--log-format", "json", *extra], stdout=stdout, stderr=err,
            stdin=subprocess.DEVNULL, text=True, cwd=ROOT, start_new_session=True)


def stop_worker(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def confirmed_in(out: Path) -> int:
    return sum(int(doc.get("confirmed", 0)) + int(doc.get("reconciled", 0))
               for doc in json_lines(out.read_text()) if "confirmed" in doc)


def wait_running(proc: subprocess.Popen[str], log: Path) -> None:
    """Until ``start`` holds the lock and has said so (its ``runner.started`` line): a
    start that meets no writable host at its own start-up exits 74 at once, as one-shot
    commands do; riding through is for a running worker."""
    wait(lambda: proc.poll() is not None or '"runner.started"' in log.read_text(), 60,
         "start to hold the lock")
    if proc.poll() is not None:
        raise RuntimeError(f"start exited {proc.returncode}: {log.read_text()[-500:]}")
