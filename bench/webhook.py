"""HTTP edge benchmarks of issue 18, rows for the table of ``python -m bench``:

* signed webhook intake: ``runner serve`` in its own process, loaded by 64 keep-alive
  clients (a minimal HTTP/1.1 client on asyncio streams, bodies signed beforehand, so the
  client spends as little of the shared CPUs as it can), one event per request; figures
  requests/s with p50/p99 latency, against the same events through 64 concurrent
  in-process ``accept`` callers (group commits), measured in the same run (target ≥ 0.5);
* ``/metrics`` on a store of 1,000,000 leads: the store time of a scrape as the server
  measures it (``runner_metrics_store_seconds``), mean over 20 scrapes (target < 100 ms).
  The store is built with one SQL statement through the schema's own triggers (the outbox
  events and the kept counts are written as accepts would write them); 1,000 of its
  records are made uncertain.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

from bench.common import ROOT, RUN, SCOPE, Row, event, workdir
from bench.leads import _accept_concurrent
from runner.io.http.auth import sign

SECRET = b"bench-synthetic-secret"
CLIENTS = 64


def _serve(db: Path, scope: Path, secret: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    out = open(log, "wb")  # noqa: SIM115 - the child writes to it until it stops
    proc = subprocess.Popen(
        [sys.executable, RUN, "serve", "--db", str(db), "--scope", str(scope),
         "--listen", "127.0.0.1:0", "--webhook-secret-file", str(secret),
         "--http-max-concurrency", "1024"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = re.search(rb"listening on port (\d+)", log.read_bytes())
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}: {log.read_bytes()[-500:]!r}")
        time.sleep(0.02)
    raise RuntimeError("serve never listened")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    if proc.wait(timeout=120) != 0:
        raise RuntimeError(f"serve exited {proc.returncode}")


def _request(path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             method: str = "POST") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    return status, await reader.readexactly(length)


async def _load(port: int, requests: list[bytes]) -> tuple[float, list[float], int]:
    """64 keep-alive connections share the requests; (seconds, latencies, non-200s)."""
    queue = list(reversed(requests))
    latencies: list[float] = []
    bad = 0

    async def client() -> None:
        nonlocal bad
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                request = queue.pop()
                began = time.perf_counter()
                status, _ = await _exchange(reader, writer, request)
                latencies.append(time.perf_counter() - began)
                bad += status != 200
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return time.perf_counter() - started, latencies, bad


def _signed_requests(first: int, n: int) -> list[bytes]:
    out = []
    for i in range(first, first + n):
        body = json.dumps(event(i), separators=(",", ":")).encode()
        out.append(_request("/webhook", body, {"X-Hub-Signature-256": sign(SECRET, body),
                                               "Content-Type": "application/json"}))
    return out


def _files(d: Path) -> tuple[Path, Path]:
    scope = d / "scope.json"
    scope.write_text(json.dumps(SCOPE), encoding="utf-8")
    secret = d / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return scope, secret


def intake(n: int) -> list[Row]:
    with workdir() as d:
        scope, secret = _files(d)
        rounds = 3
        http_rates, base_rates, p50s, p99s = [], [], [], []
        for r in range(rounds):  # alternate, so both sides see the same machine weather
            base_rates.append(anyio.run(_accept_concurrent, d / f"base{r}.db", n, CLIENTS))
            proc, port = _serve(d / f"http{r}.db", scope, secret, d / f"serve{r}.log")
            try:
                asyncio.run(_load(port, _signed_requests(10_000_000, CLIENTS)))  # warm up
                seconds, latencies, bad = asyncio.run(_load(port, _signed_requests(0, n)))
            finally:
                _stop(proc)
            if bad:
                raise RuntimeError(f"{bad} webhook requests were not answered 200")
            http_rates.append(n / seconds)
            cuts = statistics.quantiles(latencies, n=100)
            p50s.append(cuts[49] * 1000)
            p99s.append(cuts[98] * 1000)
    ratio = statistics.median(h / b for h, b in zip(http_rates, base_rates, strict=True))
    return [Row(f"webhook intake, {n:,} signed", statistics.median(http_rates), "req/s",
                statistics.median(base_rates), "accepts/s", ratio, ">= 0.5", ratio >= 0.5,
                f"{CLIENTS} keep-alive clients, one event per request, runner serve in its "
                f"own process; latency p50 {statistics.median(p50s):.1f} ms, p99 "
                f"{statistics.median(p99s):.1f} ms; baseline: {CLIENTS} concurrent "
                "in-process accept callers (group commits); medians of 3 alternated rounds")]


def build_store(db: Path, n: int, uncertain: int) -> None:
    """``n`` leads through the schema's own triggers, ``uncertain`` of them uncertain."""
    from runner.io.stores import open_store
    from runner.leads.models import validate_scope

    async def create() -> None:
        async with await open_store(str(db), scope=validate_scope(SCOPE)):
            pass

    anyio.run(create)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        scope_json = json.dumps(SCOPE, separators=(",", ":"), sort_keys=True)[1:-1]
        conn.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?) "
            "INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, "
            "updated_at) SELECT ?, printf('lead-%08d', i), "
            "printf('{%s,\"source\":\"meta\",\"source_lead_id\":\"lead-%08d\","
            "\"synthetic\":true}', ?, i), printf('w-%08d', i), "
            "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z' FROM c",
            (n, SCOPE["tenant_id"], scope_json))
        for state in ("in_flight", "uncertain"):
            conn.execute("UPDATE leads SET state = ? WHERE seq <= ?", (state, uncertain))
        conn.execute("COMMIT")
    finally:
        conn.close()


def metrics_scale(n: int, scrapes: int = 20) -> list[Row]:
    with workdir() as d:
        scope, secret = _files(d)
        db = d / "big.db"
        started = time.perf_counter()
        build_store(db, n, 1000)
        built = time.perf_counter() - started
        proc, port = _serve(db, scope, secret, d / "serve.log")
        try:
            walls, text = asyncio.run(_scrape(port, scrapes))
        finally:
            _stop(proc)
    total = float(re.search(r"runner_metrics_store_seconds_sum (\S+)", text).group(1))  # type: ignore[union-attr]
    count = float(re.search(r"runner_metrics_store_seconds_count (\S+)", text).group(1))  # type: ignore[union-attr]
    leads = sum(float(v) for v in re.findall(r'runner_leads\{state="[a-z_]+"\} (\S+)', text))
    if leads != n:
        raise RuntimeError(f"/metrics counted {leads} leads, the store holds {n}")
    store_ms = total / count * 1000
    return [Row(f"/metrics, {n:,} leads", store_ms, "ms store", 100, "ms limit",
                store_ms / 100, "< 1", store_ms < 100,
                f"mean store time of {int(count)} scrapes as the server measures it; "
                f"whole scrape p50 {statistics.median(walls) * 1000:.1f} ms; counts kept by "
                f"triggers (schema v8), never counted per scrape; store built in "
                f"{built:.0f} s")]


async def _scrape(port: int, scrapes: int) -> tuple[list[float], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    walls = []
    body = b""
    try:
        for _ in range(scrapes):
            began = time.perf_counter()
            status, body = await _exchange(reader, writer, _request("/metrics", method="GET"))
            walls.append(time.perf_counter() - began)
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
    finally:
        writer.close()
    return walls, body.decode()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.webhook [--quick] [--record]``: the two rows alone; ``--record``
    (full sizes only) writes ``bench/results/http-<UTC>.json`` for the how-to page."""
    import argparse

    from bench.common import machine, print_table
    from bench.results import record
    from bench.sizes import FULL, QUICK

    parser = argparse.ArgumentParser(description="HTTP edge benchmarks (issue 18)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    rows = intake(sizes["webhook"]) + metrics_scale(sizes["metrics"])
    print_table(rows)
    print(json.dumps([r.__dict__ for r in rows], separators=(",", ":")))
    if args.record and not args.quick:
        record("http", {"mode": "full", "sizes": {k: sizes[k] for k in ("webhook", "metrics")},
                        "seconds": round(time.perf_counter() - started, 1),
                        "summary": machine(), "rows": [r.__dict__ for r in rows]},
               script="-m bench.webhook", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
