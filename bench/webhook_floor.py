"""Webhook intake against a floor (issue 32, point 4): ``runner serve`` beside a minimal
ASGI app on the same server stack, loaded by the same 64 keep-alive clients with the same
signed requests, in interleaved rounds of one run.

    python -m bench webhook-floor            # 20,000 events per side, 5 rounds; writes
                                             # bench/results/webhook-floor-<UTC>.json
    python -m bench webhook-floor --quick    # 1,000 events, 1 round, writes nothing
    python -m bench webhook-floor --events 10000 --rounds 3 --profile serve.prof

``python -m bench`` (the ``http`` rows, ``bench/webhook.py``) runs the same comparison
beside its in-process ``accept`` baseline; this command is the comparison alone, with more
rounds, and its results file feeds the performance page.

**The floor** (``python -m bench.webhook_floor --serve``, a process of its own, as
``runner serve`` is) is served by runner's own server: ``runner.io.http.server``'s
``HttpServer`` on a socket from its ``bind``, with the limits ``runner serve`` gets from
the bench's command line (``--http-max-concurrency 1024``, the 10 s header timeout, the
5 s keep-alive): uvicorn with httptools, runner's protocol subclass (the header deadline,
one write per answer). Per ``POST /webhook`` the floor's ASGI app

1. reads the body (every ``http.request`` message, no deadline);
2. checks ``X-Hub-Signature-256`` with runner's own ``auth.check_signature`` (401 without
   the header, 403 when it does not match), before it parses anything;
3. parses the body with ``json.loads``, checks that it is an object whose four scope
   fields equal the configured scope and whose ``source_lead_id`` is a non-empty string
   (else 422), and makes its canonical JSON (``json.dumps``, sorted keys, compact) and a
   write_id (``runner.leads.intake.new_write_id``: the same time-ordered ids, so the
   write_id index sees the same inserts);
4. queues the row for the group commit and waits: one writer thread (``sqlite3``) commits
   everything queued in one transaction (``BEGIN IMMEDIATE``; the rows in one
   ``executemany`` of ``INSERT … ON CONFLICT (tenant_id, source_lead_id) DO NOTHING``;
   when the connection's change count says a key was known, a read of each row's stored
   write_id: another one is answered ``duplicate`` when its canonical JSON is the same,
   else 409 ``conflict``; then one ``executemany`` of the new rows' outbox events,
   ``accepted`` with the payload runner's trigger writes; ``COMMIT``). Requests arriving while
   a commit runs are committed together in the next one; each is answered only after the
   commit that holds its row (200 and runner's answer line:
   ``{"result":"accepted","source_lead_id":…,"write_id":…}``).

Its store: ``leads`` (a primary key, ``write_id`` unique, ``(tenant_id, source_lead_id)``
unique, the ``(state, seq)`` index runner keeps, runner's columns and defaults) and
``outbox`` (a primary key); the durability is runner's: WAL, ``synchronous = FULL``,
runner's page cache. Every other route answers 404.

**What runner does beyond it** per request: its app routes four endpoints and bounds the
body (size, and a read deadline when the body is not there at once), refuses a request
while stopping, and answers NDJSON bodies too; it parses the body strictly
(``runner.jsonio.parse_object``: duplicate keys, depth and size limits) and validates the
event with pydantic against the scope (``LeadEvent``: every field's rules, the contact
fields); its canonical JSON is runner's (``runner.jsonio.canonical``); the group commit is
``runner.leads.intake.Intake`` over the store's ``accept_many`` (aiosqlite's thread, one
multi-row ``INSERT … RETURNING`` per group), through the replication check and the commit
counter of ``runner serve``; the store's triggers guard the row and write the outbox event
and the kept counts (per state and per outbox kind) in SQL; the crash points around the
commit; the request metrics (a histogram by route and status) and the accepted counts; a
rate-limited log line per refusal. Both answer after the commit, both refuse an unsigned
or wrongly signed request before parsing it, both keep one row per key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS leads (seq INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, "
    "source_lead_id TEXT NOT NULL, canonical TEXT NOT NULL, write_id TEXT NOT NULL UNIQUE, "
    "state TEXT NOT NULL DEFAULT 'prepared', attempts INTEGER NOT NULL DEFAULT 0, "
    "reconcile_attempts INTEGER NOT NULL DEFAULT 0, snapshot TEXT, last_polled_at TEXT, "
    "accepted_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE (tenant_id, source_lead_id))",
    "CREATE INDEX IF NOT EXISTS leads_by_state ON leads (state, seq)",
    "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
    "subject TEXT, payload TEXT NOT NULL, at TEXT NOT NULL)",
)
_INSERT = ("INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, "
           "updated_at) VALUES (?, ?, ?, ?, ?, ?) "
           "ON CONFLICT (tenant_id, source_lead_id) DO NOTHING")
_EVENT = ("INSERT INTO outbox (kind, subject, payload, at) VALUES ('accepted', ?, "
          "json_object('tenant_id', ?, 'write_id', ?, 'state', 'prepared'), ?)")
_STORED = "SELECT write_id, canonical FROM leads WHERE tenant_id = ? AND source_lead_id = ?"
_SCOPE_FIELDS = ("tenant_id", "account_id", "page_id", "form_id")

Row = tuple[str, str, str, str]  # tenant_id, source_lead_id, canonical, write_id
Outcome = tuple[str, str]  # result ("accepted", "duplicate", "conflict"), write_id
Send = Callable[[dict[str, Any]], Awaitable[None]]
_quote: Callable[[str], str] = json.encoder.encode_basestring


class GroupCommit:
    """One writer thread with its own ``sqlite3`` connection; rows queued while it commits
    go into its next transaction."""

    def __init__(self, db: Path) -> None:
        from runner.io.sqlite.connection import CACHE_KIB

        self._thread = ThreadPoolExecutor(1, thread_name_prefix="floor-writer")
        self._conn: sqlite3.Connection = self._thread.submit(self._open, db, CACHE_KIB).result()
        self._queue: list[tuple[Row, asyncio.Future[Outcome]]] = []
        self._committing = False
        self.commits = 0

    @staticmethod
    def _open(db: Path, cache_kib: int) -> sqlite3.Connection:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA cache_size = -{cache_kib}")
        for statement in _SCHEMA:
            conn.execute(statement)
        return conn

    async def accept(self, row: Row) -> Outcome:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        self._queue.append((row, done))
        if not self._committing:
            self._committing = True
            loop.create_task(self._flush())  # noqa: RUF006 - it ends when the queue is empty
        return await done

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    outcomes = await loop.run_in_executor(
                        self._thread, self._write, [row for row, _ in batch])
                except Exception as exc:  # each waiter gets the error
                    for _, done in batch:
                        done.set_exception(exc)
                    continue
                for (_, done), outcome in zip(batch, outcomes, strict=True):
                    if not done.cancelled():
                        done.set_result(outcome)
        finally:
            self._committing = False

    def _write(self, rows: list[Row]) -> list[Outcome]:
        """One transaction for the group: the rows in one ``executemany`` (a known key
        inserts nothing), then the outbox events of the new ones in another. When every
        key was new (the bulk case, told by the connection's change count), that is all;
        else each row's stored write_id says whether it was this one."""
        conn = self._conn
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        conn.execute("BEGIN IMMEDIATE")
        try:
            before = conn.total_changes
            conn.executemany(_INSERT, [(*row, at, at) for row in rows])
            out: list[Outcome] = [("accepted", row[3]) for row in rows]
            if conn.total_changes - before != len(rows):
                for i, (tenant, key, canonical, write_id) in enumerate(rows):
                    stored_id, stored = conn.execute(_STORED, (tenant, key)).fetchone()
                    if stored_id != write_id:
                        out[i] = ("duplicate" if stored == canonical else "conflict",
                                  stored_id)
            conn.executemany(_EVENT, [(row[1], row[0], row[3], at) for row, (result, _)
                                      in zip(rows, out, strict=True) if result == "accepted"])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.commits += 1
        return out

    def close(self) -> None:
        self._thread.submit(self._conn.close).result()
        self._thread.shutdown()


class FloorApp:
    """The floor's ASGI app: ``POST /webhook``, signed, one event per request."""

    def __init__(self, store: GroupCommit, secret: bytes, scope: dict[str, str]) -> None:
        from runner.io.http.auth import WebhookAuth

        self.store, self.scope = store, scope
        self.auth = WebhookAuth(secret=secret)

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[
            dict[str, Any]]], send: Send) -> None:
        from runner.io.http.auth import SIGNATURE_HEADER, Verdict, check_signature

        if scope["type"] != "http":
            return
        if scope["path"] != "/webhook" or scope["method"] != "POST":
            await _answer(send, 404, b'{"error":"not_found"}')
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        header = dict(scope["headers"]).get(SIGNATURE_HEADER)
        verdict = check_signature(self.auth, header, body)
        if verdict is not Verdict.VALID:
            status = 401 if verdict is Verdict.MISSING else 403
            await _answer(send, status, b'{"error":"forbidden"}')
            return
        row = self._row(body)
        if row is None:
            await _answer(send, 422, b'{"error":"invalid"}')
            return
        result, write_id = await self.store.accept(row)
        if result == "conflict":
            await _answer(send, 409, b'{"result":"rejected","source_lead_id":'
                          + _quote(row[1]).encode() + b',"write_id":null,'
                          b'"reason":"conflict"}\n')
            return
        await _answer(send, 200, f'{{"result":"{result}","source_lead_id":{_quote(row[1])},'
                                 f'"write_id":{_quote(write_id)}}}\n'.encode())

    def _row(self, body: bytes) -> Row | None:
        from runner.leads.intake import new_write_id

        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if not isinstance(doc, dict) or any(doc.get(k) != self.scope[k] for k in _SCOPE_FIELDS):
            return None
        key = doc.get("source_lead_id")
        if not isinstance(key, str) or not key:
            return None
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return self.scope["tenant_id"], key, canonical, new_write_id()


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def serve(db: Path, secret: bytes, scope: dict[str, str], max_concurrency: int) -> None:
    """Serve the floor on a free loopback port until SIGINT/SIGTERM (then drain)."""
    import anyio

    from runner.io.http.server import Address, HttpServer, ServerLimits, bind

    store = GroupCommit(db)
    try:
        server = HttpServer(FloorApp(store, secret, scope), bind(Address("127.0.0.1", 0)),
                            grace=30.0, limits=ServerLimits(max_concurrency=max_concurrency))
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    async for _ in signals:
                        server.stop()
                        return

                tg.start_soon(watch)
                await server.serve()  # logs "listening on port N" (runner.http)
                tg.cancel_scope.cancel()
    finally:
        store.close()
    print(f"floor stopped after {store.commits} commits", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench webhook-floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true",
                        help="be the floor's server (the bench starts it so)")
    parser.add_argument("--db", type=Path, help="--serve: the floor's store file")
    parser.add_argument("--scope", type=Path, help="--serve: the scope JSON file")
    parser.add_argument("--secret-file", type=Path, help="--serve: the webhook secret")
    parser.add_argument("--http-max-concurrency", type=int, default=1024)
    parser.add_argument("--quick", action="store_true",
                        help="the quick sizes (1,000 events, one round); writes nothing")
    parser.add_argument("--events", type=int, help="events per side per round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds")
    parser.add_argument("--profile", type=Path,
                        help="also profile runner serve under the load (cProfile) to PATH")
    args = parser.parse_args(argv)
    if not args.serve:
        from bench.webhook import floor_main

        return floor_main(args, argv)
    if args.db is None or args.scope is None or args.secret_file is None:
        parser.error("--serve needs --db, --scope and --secret-file")
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    scope = json.loads(args.scope.read_text(encoding="utf-8"))
    import anyio

    anyio.run(serve, args.db, args.secret_file.read_bytes(), scope, args.http_max_concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
