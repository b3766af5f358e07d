"""Webhook intake over real loopback HTTP (issue 18 points 2 and 6): a real uvicorn server
in process on an ephemeral port, a real store (both backends), an httpx client."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from tests.faultstore import CountdownStore
from tests.helpers import SCOPE, dump_store, event
from tests.httpkit import SECRET, TOKEN, body_of, ndjson, serving, signed, wait_until

pytestmark = pytest.mark.timeout(60)


async def records(served: Any) -> dict[str, Any]:
    store = served.worker.store
    return {r.source_lead_id: r async for r in store.iter_records()}


async def test_a_signed_event_is_committed_before_the_200(db_location: str) -> None:
    async with serving(db_location) as s:
        response = await s.post(body_of(event(1)))
        assert response.status_code == 200
        answer = response.json()
        assert answer["result"] == "accepted" and answer["source_lead_id"] == "lead-1"
        stored = await records(s)
        assert stored["lead-1"].write_id == answer["write_id"]
        again = await s.post(body_of(event(1)))
        assert again.status_code == 200
        assert again.json() == {**answer, "result": "duplicate"}


async def test_a_conflict_is_409_and_changes_nothing(db_location: str) -> None:
    async with serving(db_location) as s:
        assert (await s.post(body_of(event(1)))).status_code == 200
        response = await s.post(body_of(event(1, contact_alias="other-alias")))
        assert response.status_code == 409
        assert response.json()["reason"] == "conflict"
        assert len(await records(s)) == 1


@pytest.mark.parametrize(("doc", "reason"), [
    (event(1, tenant_id="tenant-other"), "scope_mismatch"),
    (event(1, synthetic=False), "invalid_record"),
    (event(1, extra_field=1), "invalid_record"),
    ([event(1)], "not_an_object"),
])
async def test_an_invalid_record_is_422_with_accepts_reason(
        db_location: str, doc: Any, reason: str) -> None:
    async with serving(db_location) as s:
        response = await s.post(body_of(doc))
        assert response.status_code == 422, response.text
        answer = response.json()
        assert answer["result"] == "rejected"
        assert answer["reason"].startswith(reason.split("_")[0])
        assert await records(s) == {}


async def test_a_body_that_is_not_json_is_400(db_location: str) -> None:
    async with serving(db_location) as s:
        response = await s.post(b'{"tenant_id": ')
        assert response.status_code == 400
        assert response.json()["reason"] == "invalid_json"


async def test_a_body_over_the_limit_is_413_declared_or_streamed(db_location: str) -> None:
    async with serving(db_location, body_limit=2048) as s:
        big = body_of(event(1, contact_alias="x" * 4096))
        assert (await s.post(big)).status_code == 413

        async def chunks() -> Any:  # no Content-Length: the limit counts what arrives
            for _ in range(8):
                yield b"x" * 512

        response = await s.client.post(f"{s.url}/webhook", content=chunks(),
                                       headers=signed(b"whatever"))
        assert response.status_code == 413
        assert await records(s) == {}


async def test_unsigned_and_wrongly_signed_requests_touch_nothing(db_location: str) -> None:
    async with serving(db_location) as s:
        before = dump_store(db_location)
        body = body_of(event(1))
        assert (await s.post(body, headers={})).status_code == 401
        for header in (signed(body, b"another-secret"), signed(body + b" "),
                       {"X-Hub-Signature-256": "sha1=00"}, {"X-Hub-Signature-256": "sha256="},
                       {"X-Hub-Signature-256": "sha256=" + "0" * 64}):
            response = await s.post(body, headers=header)
            assert response.status_code == 403, header
            assert SECRET.decode() not in response.text
        assert dump_store(db_location) == before


async def test_without_a_secret_every_post_is_refused(db_location: str) -> None:
    async with serving(db_location, secret=None) as s:
        body = body_of(event(1))
        assert (await s.post(body)).status_code == 403
        assert await records(s) == {}


async def test_the_subscription_handshake(db_location: str) -> None:
    async with serving(db_location) as s:
        ok = await s.get("/webhook", params={"hub.mode": "subscribe",
                                             "hub.verify_token": TOKEN,
                                             "hub.challenge": "1158201444"})
        assert ok.status_code == 200 and ok.text == "1158201444"
        for params in ({"hub.mode": "subscribe", "hub.verify_token": "wrong",
                        "hub.challenge": "1"},
                       {"hub.mode": "unsubscribe", "hub.verify_token": TOKEN,
                        "hub.challenge": "1"},
                       {"hub.mode": "subscribe", "hub.challenge": "1"},
                       {}):
            refused = await s.get("/webhook", params=params)
            assert refused.status_code == 403
            assert TOKEN not in refused.text
    async with serving(db_location, token=None) as s:
        refused = await s.get("/webhook", params={"hub.mode": "subscribe",
                                                  "hub.verify_token": TOKEN,
                                                  "hub.challenge": "1"})
        assert refused.status_code == 403


async def test_ndjson_is_one_answer_per_line_and_the_worst_status(db_location: str) -> None:
    async with serving(db_location) as s:
        body = ndjson([event(1), event(2, tenant_id="tenant-other"), event(3)])
        response = await s.post(body, headers={**signed(body),
                                               "Content-Type": "application/x-ndjson"})
        assert response.status_code == 422
        lines = [line for line in response.text.splitlines() if line]
        results = [__import__("json").loads(line)["result"] for line in lines]
        assert results == ["accepted", "rejected", "accepted"]
        assert sorted(await records(s)) == ["lead-1", "lead-3"]
        again = ndjson([event(1), event(3)])
        response = await s.post(again, headers={**signed(again),
                                                "Content-Type": "application/x-ndjson"})
        assert response.status_code == 200


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_failing_store_is_503_with_retry_after_never_200(
        db_location: str, when: str) -> None:
    async with serving(db_location) as s:
        real = s.worker._store
        s.worker._store = CountdownStore(real, 1, when, only="accept_many")  # type: ignore[arg-type]
        try:
            response = await s.post(body_of(event(1)))
        finally:
            s.worker._store = real
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) > 0
        retried = await s.post(body_of(event(1)))  # the sender's retry is safe
        assert retried.status_code == 200
        assert retried.json()["result"] == ("accepted" if when == "before" else "duplicate")


class GatedStore:
    """Holds intake commits until released, to have requests in flight at a known point."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.commits: list[int] = []

    async def accept_many(self, items: Any, now: Any) -> Any:
        self.commits.append(len(items))
        self.entered.set()
        await self.release.wait()
        return await self.inner.accept_many(items, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_concurrent_requests_share_group_commits(db_location: str) -> None:
    async with serving(db_location) as s:
        gate = GatedStore(s.worker._store)
        s.worker._store = gate  # type: ignore[assignment]
        answers: list[int] = []

        async def post(i: int) -> None:
            answers.append((await s.post(body_of(event(i)))).status_code)

        intake = s.service.server.app.intake
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, 0)
            await gate.entered.wait()
            for i in range(1, 10):
                tg.start_soon(post, i)
            await wait_until(lambda: len(intake._queue) == 9)  # type: ignore[attr-defined]
            gate.release.set()
        s.worker._store = gate.inner
        assert answers == [200] * 10
        assert gate.commits == [1, 9]
        assert len(await records(s)) == 10


async def test_a_stop_answers_requests_already_received(db_location: str) -> None:
    async with serving(db_location) as s:
        gate = GatedStore(s.worker._store)
        s.worker._store = gate  # type: ignore[assignment]
        got: list[Any] = []

        async def post() -> None:
            got.append(await s.post(body_of(event(1))))

        async with anyio.create_task_group() as tg:
            tg.start_soon(post)
            await gate.entered.wait()  # received, its commit in progress
            s.service.stop()
            await wait_until(lambda: _refused(s.port))  # the listener is closed
            gate.release.set()
        assert got[0].status_code == 200 and got[0].json()["result"] == "accepted"
        s.worker._store = gate.inner
        assert list(await records(s)) == ["lead-1"]


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


async def test_unknown_paths_and_methods(db_location: str) -> None:
    async with serving(db_location) as s:
        assert (await s.get("/nope")).status_code == 404
        assert (await s.client.put(f"{s.url}/webhook")).status_code == 405
        assert (await s.client.post(f"{s.url}/metrics")).status_code == 405


def test_scope_of_fixtures_is_synthetic() -> None:
    assert all("synthetic" in value for value in SCOPE.values())
