"""kill -9 of a serving process under a signed webhook load (issue 18 point 6), counted
the way ``bench/kill9.py`` counts.

    python bench/kill9_http.py --runs 10 --leads 600 --seed 18 --record   # documented run
    python bench/kill9_http.py --runs 2 --leads 200 --seed 18             # what CI runs

Each run: ``runner start --listen 127.0.0.1:0`` (intake, the delivery loop and its lock in
one process) is loaded by 16 keep-alive clients, each posting signed events one by one
(each key is posted until it is answered 200: a transport error or a 503 means "retry",
as a webhook sender does); 1-3 times the process is SIGKILLed at a random moment and
started again on a new port; then the load finishes and ``start --cycles 1`` completes
delivery.  Counted per run, over every answer the clients received:

* lost: a key answered 200 that is not in the store at the end (or not delivered:
  neither confirmed nor uncertain);
* twice: a key answered ``accepted`` twice, or answered with two write_ids (a second
  record for one lead);
* duplicated: a key with more than one row in the target;
* wrong: an answer other than 200 or 503 (a 5xx without Retry-After, a 4xx for a valid
  signed event).

Pass: lost = twice = duplicated = wrong = 0 and every invariant of ``bench/invariants.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.chaos_lane import (  # noqa: E402
    add_backend_arguments,
    drop_postgres_schema,
    postgres_location,
)
from bench.results import record  # noqa: E402
from harness.invariants import audit, query  # noqa: E402
from runner.io.http.auth import sign  # noqa: E402

RUN = str(ROOT / "run.py")
SCOPE = {"tenant_id": "k9h-tenant", "account_id": "k9h-account", "page_id": "k9h-page",
         "form_id": "k9h-form"}
SECRET = b"bench-synthetic-secret"
CLIENTS = 16
FINAL_STATES = {"confirmed", "uncertain", "confirmed_then_missing"}


@dataclass
class Result:
    run: int
    leads: int
    kills: int = 0
    answered: int = 0
    retried: int = 0
    lost: int = 0
    twice: int = 0
    duplicated: int = 0
    wrong: int = 0
    confirmed: int = 0
    uncertain: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)


class Server:
    """One ``start --listen`` process; its port read from its log."""

    def __init__(self, db: str, scope: Path, target: Path, secret: Path, log: Path) -> None:
        self.log = log
        self.offset = log.stat().st_size if log.exists() else 0
        with open(log, "a", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, RUN, "start", "--db", db, "--scope", str(scope),
                 "--target", str(target), "--interval", "0.05", "--listen", "127.0.0.1:0",
                 "--webhook-secret-file", str(secret)],
                stdout=out, stderr=subprocess.STDOUT, text=True)
        self.port = self._port()

    def _port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_text(encoding="utf-8")[self.offset:]
            match = re.search(r"listening on port (\d+)", text)
            if match:
                return int(match.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {text[-500:]}")
            time.sleep(0.02)
        raise RuntimeError("server never listened")


class Load:
    """Clients posting every key until it is answered 200; all answers recorded."""

    def __init__(self, keys: list[str]) -> None:
        self.todo = list(keys)
        self.lock = threading.Lock()
        self.answers: list[tuple[str, int, str | None, str | None]] = []
        self.port = 0
        self.retries = 0
        self.stop = threading.Event()

    def next_key(self) -> str | None:
        with self.lock:
            return self.todo.pop() if self.todo else None

    def give_back(self, key: str) -> None:
        with self.lock:
            self.todo.insert(0, key)
            self.retries += 1

    def client(self) -> None:
        http = httpx.Client(timeout=10)
        try:
            while not self.stop.is_set():
                key = self.next_key()
                if key is None:
                    return
                body = json.dumps({**SCOPE, "source": "meta", "source_lead_id": key,
                                   "synthetic": True, "contact_alias": f"a-{key}"}).encode()
                try:
                    response = http.post(f"http://127.0.0.1:{self.port}/webhook",
                                         content=body,
                                         headers={"X-Hub-Signature-256": sign(SECRET, body)})
                except httpx.TransportError:
                    self.give_back(key)  # no answer: the sender retries
                    time.sleep(0.01)
                    continue
                doc: dict[str, Any] = {}
                if response.headers.get("content-type", "").startswith("application/json"):
                    doc = response.json()
                with self.lock:
                    self.answers.append((key, response.status_code, doc.get("result"),
                                         doc.get("write_id")))
                if response.status_code != 200:
                    self.give_back(key)
                    time.sleep(0.01)
        finally:
            http.close()


def one_run(index: int, leads: int, seed: int, root: Path, pg_dsn: str | None) -> Result:
    rng = random.Random(f"{seed}:{index}")
    result = Result(index, leads)
    started = time.monotonic()
    work = root / f"run-{index:03d}"
    work.mkdir(mode=0o700)
    target, log, secret = work / "target.db", work / "server.log", work / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    db = (postgres_location(pg_dsn, f"kill9h_{seed}_{index}_{os.getpid()}") if pg_dsn
          else str(work / "queue.db"))
    scope = work / "scope.json"
    scope.write_text(json.dumps(SCOPE), encoding="utf-8")
    load = Load([f"k{index}-{i:06d}" for i in range(leads)])
    server = Server(db, scope, target, secret, log)
    load.port = server.port
    threads = [threading.Thread(target=load.client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for _ in range(rng.randint(1, 3)):
        time.sleep(rng.uniform(0.2, 1.5))  # let the load run; the kill falls anywhere
        if server.proc.poll() is not None:
            result.violations.append(f"the server exited by itself ({server.proc.returncode})")
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=60)
        result.kills += 1
        server = Server(db, scope, target, secret, log)
        load.port = server.port
    for thread in threads:
        thread.join(timeout=600)
    server.proc.send_signal(signal.SIGTERM)
    if server.proc.wait(timeout=120) != 0:
        result.violations.append(f"the last server exited {server.proc.returncode}")
    final = subprocess.run([sys.executable, RUN, "start", "--db", db, "--scope", str(scope),
                            "--target", str(target), "--cycles", "1", "--interval", "0"],
                           capture_output=True, text=True, timeout=600, check=False)
    if final.returncode != 0:
        result.violations.append(f"the completing run exited {final.returncode}")
    ok_keys: dict[str, set[str]] = {}
    accepted_answers: dict[str, int] = {}
    for key, code, answer, write_id in load.answers:
        if code == 200:
            ok_keys.setdefault(key, set()).add(str(write_id))
            if answer == "accepted":
                accepted_answers[key] = accepted_answers.get(key, 0) + 1
        elif code != 503:
            result.wrong += 1
    result.answered = len(load.answers)
    result.retried = load.retries
    end = audit(db, target, accepted=set(ok_keys), in_flight_ok=False)
    result.violations += [v for v in end.violations
                          if not v.startswith(("lost", "duplicated", "unexpected"))]
    stored = {str(k): (str(s), str(w)) for k, s, w in
              query(db, "SELECT source_lead_id, state, write_id FROM {t}leads")}
    result.lost = sum(1 for key in ok_keys if stored.get(key, ("", ""))[0] not in FINAL_STATES)
    result.twice = sum(1 for key, ids in ok_keys.items()
                       if len(ids) > 1 or accepted_answers.get(key, 0) > 1
                       or (key in stored and ids != {stored[key][1]}))
    result.duplicated = sum(1 for n in end.rows.values() if n > 1)
    result.confirmed = end.states["confirmed"]
    result.uncertain = end.states["uncertain"]
    if len(ok_keys) != leads:
        result.violations.append(f"only {len(ok_keys)} of {leads} keys were answered 200")
    result.seconds = time.monotonic() - started
    if pg_dsn and not result.violations:
        drop_postgres_schema(db)
    return result


COLUMNS = ("run", "leads", "kills", "answered", "retried", "lost", "twice", "duplicated",
           "wrong", "confirmed", "uncertain", "seconds")


def table(results: list[Result], seed: int) -> tuple[str, bool]:
    lines = [f"kill -9 of a serving process: {len(results)} runs, seed {seed}", "",
             " ".join(f"{c:>10}" for c in COLUMNS)]
    lines.append("-" * len(lines[-1]))
    for r in results:
        lines.append(" ".join(f"{getattr(r, c):>10.1f}" if c == "seconds"
                              else f"{getattr(r, c):>10}" for c in COLUMNS))
    bad = [f"VIOLATION run {r.run}: {v}" for r in results for v in r.violations]
    ok = not bad and all(r.lost == r.twice == r.duplicated == r.wrong == 0 for r in results)
    lines += [*bad, f"result: {'PASS' if ok else 'FAIL'} "
                    "(lost = twice = duplicated = wrong = 0)"]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--leads", type=int, default=600)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--record", action="store_true",
                        help="also write the figures to bench/results/kill9-http-<UTC>.json")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    pg_dsn = args.pg_dsn if args.backend == "postgres" else None
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="runner-kill9-http-"))
    results = [one_run(i, args.leads, args.seed, root, pg_dsn) for i in range(args.runs)]
    text, ok = table(results, args.seed)
    text = text.replace("process:", f"process ({args.backend}):", 1)
    print(text, flush=True)
    payload = {"ok": ok, "runs": len(results), "seed": args.seed,
               "results": [{**r.__dict__, "seconds": round(r.seconds, 1)} for r in results]}
    if args.json:
        Path(args.json).write_text(json.dumps(payload), encoding="utf-8")
    if args.record:
        totals = {c: sum(getattr(r, c) for r in results) for c in COLUMNS[1:]}
        totals["seconds"] = round(totals["seconds"], 1)
        record("kill9-http", {"backend": args.backend, "leads": args.leads,
                              "seconds": round(time.monotonic() - started, 1),
                              "totals": totals, **payload},
               script="bench/kill9_http.py", argv=argv)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept for inspection: {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
