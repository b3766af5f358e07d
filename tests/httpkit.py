"""Helpers for tests of the HTTP edge: an in-process server on an ephemeral loopback port,
signed requests, and waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from runner.commands.serve import HttpOptions, HttpService, build_service
from runner.io.http.auth import WebhookAuth, sign
from runner.io.http.server import Address
from runner.worker import DurableWorker
from tests.helpers import SCOPE

SECRET = b"synthetic-app-secret-5d1c"
TOKEN = "synthetic-verify-token-a8e2"


def signed(body: bytes, secret: bytes = SECRET) -> dict[str, str]:
    return {"X-Hub-Signature-256": sign(secret, body)}


def body_of(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def ndjson(docs: list[Any]) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


@dataclass
class Served:
    worker: DurableWorker
    service: HttpService
    client: httpx.AsyncClient

    @property
    def port(self) -> int:
        return self.service.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def post(self, body: bytes, headers: dict[str, str] | None = None,
                   **kw: Any) -> httpx.Response:
        return await self.client.post(f"{self.url}/webhook", content=body,
                                      headers=signed(body) if headers is None else headers,
                                      **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.client.get(f"{self.url}{path}", **kw)


@asynccontextmanager
async def serving(db: str, *, mode: str = "serve", secret: bytes | None = SECRET,
                  token: str | None = TOKEN, grace: float = 5.0,
                  **options: Any) -> AsyncIterator[Served]:
    """A real uvicorn server on 127.0.0.1 (ephemeral port) over a real store, in this
    process; stopped (drained) on exit."""
    opts = HttpOptions(WebhookAuth(secret=secret, verify_token=token),
                       Address("127.0.0.1", 0), **options)
    async with DurableWorker(db, SCOPE) as worker:
        service = build_service(opts, worker, mode=mode,  # type: ignore[arg-type]
                                grace=grace)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg, httpx.AsyncClient(timeout=30) as client:
                await tg.start(_serve, service)
                try:
                    yield Served(worker, service, client)
                finally:
                    service.stop()


async def _serve(service: HttpService, *, task_status: Any) -> None:
    await service.server.serve(task_status=task_status)


async def wait_until(predicate: Any, within: float = 20) -> None:
    """Re-check ``predicate`` (sync or async) at every loop turn until it holds."""
    with anyio.fail_after(within):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return
            await anyio.sleep(0.01)


def port_of(child: Any, within: float = 30) -> int:
    """The port a child process announced (``http.listening``), waiting for the line."""
    import re

    pattern = re.compile(r"listening on port (\d+)")
    child.wait_for(lambda c: any(pattern.search(line) for line in c.err), within,
                   "the listening line")
    for line in child.err:
        match = pattern.search(line)
        if match:
            return int(match.group(1))
    raise AssertionError("unreachable")


def wait_ready(port: int, child: Any = None, within: float = 30) -> dict[str, Any]:
    """Poll /readyz until it answers 200 (the child must stay alive meanwhile)."""
    import time

    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise AssertionError(f"child exited: {child.err}")
        try:
            last = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            if last.status_code == 200:
                return dict(last.json())
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"never ready: {last and last.text}")
