"""Pipeline claims, leases and outcomes for PostgreSQL (SPEC P2-P4).

A claim is one statement: a CTE picks up to ``limit`` claimable rows (pending and due, or
claimed under a lease that has run out) with ``FOR UPDATE SKIP LOCKED``, so concurrent
claimers on any number of hosts never wait for each other and never take the same row;
the UPDATE marks them with a new fencing token (``nextval``) and the lease expiry, and
returns the inputs with it.  PostgreSQL re-checks the WHERE clause against the latest
version of a row it locks, so a row another claimer took a moment ago is not taken again.

A completion is one transaction: it first locks the batch's rows (``FOR UPDATE``) and
checks that every one is still held under the token, unexpired, and otherwise writes
nothing; then the outputs (sorted by key, so two completions never deadlock on records;
merged records under a transaction advisory lock per key, so two merges of one record
queue instead of losing a field); then the outcomes, one UPDATE per distinct outcome.

Registering a new processor version locks ``pipeline_records`` in SHARE mode for the rest
of its (short) transaction, so no record can be written between the backlog sync and
the commit without its trigger seeing the new processor: without it, a record committed
by another session in that window would get no work row until the next resync.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from runner.io.postgres.base import PostgresBase
from runner.io.postgres.connection import stable_key
from runner.pipeline.model import (
    CLOCK_HORIZON_MS,
    Claim,
    Completion,
    Item,
    LeaseLost,
    Output,
    ProcessorRef,
    canonical,
    merge_fields,
    stage_of,
)

_REGISTER = """
INSERT INTO {s}.pipeline_processors
    (name, version, stage, input_level, capability, rebacklog, registered_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (name, version) DO NOTHING
RETURNING name
"""
_CURRENT = """
SELECT name, version, stage, capability, rebacklog FROM {s}.pipeline_processors p
WHERE NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors q
                  WHERE q.name = p.name AND q.version > p.version)
ORDER BY input_level, name
"""
_SYNC = """
INSERT INTO {s}.pipeline_work (input_id, processor, version, state, available_at, input_rev)
SELECT r.id, $1, $2, 'pending', $3, r.rev FROM {s}.pipeline_records r
WHERE r.level = $4
  AND ($5 OR NOT EXISTS (SELECT 1 FROM {s}.pipeline_work o
                         WHERE o.input_id = r.id AND o.processor = $1 AND o.state = 'done'))
ON CONFLICT (input_id, processor, version) DO NOTHING
"""
_FORCE = """
UPDATE {s}.pipeline_work SET state = 'pending', available_at = $3
WHERE processor = $1 AND version = $2 AND state = 'done'
"""
_PENDING = """
SELECT (SELECT count(*) FROM {s}.pipeline_work
        WHERE processor = $1 AND version = $2 AND state <> 'done')
     + (SELECT count(*) FROM {s}.pipeline_records r
        WHERE r.level = $3
          AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_work w WHERE w.input_id = r.id
                          AND w.processor = $1 AND w.version = $2)
          AND ($4 OR NOT EXISTS (SELECT 1 FROM {s}.pipeline_work o
                                 WHERE o.input_id = r.id AND o.processor = $1
                                   AND o.state = 'done'))) AS pending
"""
_CLAIM = """
WITH picked AS (
    SELECT id FROM {s}.pipeline_work
    WHERE processor = $1 AND version = $2 AND state <> 'done'
      AND (available_at <= $3 OR available_at > $3 + $7::bigint)
    ORDER BY available_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), token AS (
    SELECT nextval('{s}.pipeline_fence_seq') AS fence
)
UPDATE {s}.pipeline_work w
SET state = 'claimed', owner = $5, fence = token.fence, available_at = $6,
    attempts = w.attempts + 1, input_rev = r.rev
FROM picked, token, {s}.pipeline_records r
WHERE w.id = picked.id AND r.id = w.input_id
RETURNING w.id, w.input_id, r.key, r.payload, w.input_rev, w.attempts, w.fence
"""
_HELD = """
SELECT count(*) FROM (SELECT 1 FROM {s}.pipeline_work
                      WHERE fence = $1 AND state = 'claimed' AND available_at >= $2
                      FOR UPDATE) AS held
"""
_RENEW = """
UPDATE {s}.pipeline_work SET available_at = $1
WHERE fence = $2 AND state = 'claimed' AND available_at >= $3
"""
_RELEASE = """
UPDATE {s}.pipeline_work SET state = 'pending', available_at = $1
WHERE fence = $2 AND state = 'claimed'
"""
# an input that changed since the claim read it goes back to the backlog
_FINISH = """
UPDATE {s}.pipeline_work w
SET state = CASE WHEN $1 = 'done' AND w.input_rev IS DISTINCT FROM r.rev
                 THEN 'pending' ELSE $1 END,
    outcome = $2, error = $3, retryable = $4, available_at = $5, done_ms = $6
FROM {s}.pipeline_records r
WHERE r.id = w.input_id AND w.fence = $7 AND w.state = 'claimed' AND w.id = ANY($8::bigint[])
"""
_REPLACE = """
INSERT INTO {s}.pipeline_records AS p
    (level, key, payload, orders, processor, version, input_id, updated_ms)
SELECT $1, t.key, t.payload, t.orders, $2, $3, t.input_id, $4
FROM unnest($5::text[], $6::text[], $7::text[], $8::bigint[])
     AS t(key, payload, orders, input_id)
ORDER BY t.key
ON CONFLICT (level, key) DO UPDATE
SET rev = p.rev + (p.payload IS DISTINCT FROM excluded.payload)::integer,
    payload = excluded.payload, orders = excluded.orders, processor = excluded.processor,
    version = excluded.version, input_id = excluded.input_id, updated_ms = excluded.updated_ms
WHERE p.payload IS DISTINCT FROM excluded.payload OR p.orders IS DISTINCT FROM excluded.orders
"""
_LOCK_KEY = "SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k ORDER BY k"


class PipelineWorkQueries(PostgresBase):
    async def register_processors(self, refs: Sequence[ProcessorRef], now_ms: int) -> None:
        async with self._transaction():
            for ref in refs:
                new = await self._fetch(
                    _REGISTER, ref.name, ref.version, ref.stage.value, ref.stage.input_level,
                    ref.capability, ref.rebacklog_on_version_bump, now_ms)
                if new:
                    # wait for every transaction writing records to finish, and hold new
                    # ones back until this commits: a record written meanwhile either is
                    # seen by the sync below or sees this processor in its trigger
                    await self._fetch("LOCK TABLE {s}.pipeline_records IN SHARE MODE")
                    await self._sync(ref, now_ms, force=False)

    async def sync_backlog(self, ref: ProcessorRef, now_ms: int, *, force: bool = False
                           ) -> int:
        async with self._transaction():
            return await self._sync(ref, now_ms, force=force)

    async def _sync(self, ref: ProcessorRef, now_ms: int, *, force: bool) -> int:
        count = await self._count(_SYNC, ref.name, ref.version, now_ms,
                                  ref.stage.input_level,
                                  force or ref.rebacklog_on_version_bump)
        if force:
            count += await self._count(_FORCE, ref.name, ref.version, now_ms)
        return count

    async def registered_processors(self) -> list[ProcessorRef]:
        async with self._guard():
            rows = await self._fetch(_CURRENT)
        return [ProcessorRef(str(r["name"]), int(r["version"]), stage_of(str(r["stage"])),
                             str(r["capability"]), bool(r["rebacklog"])) for r in rows]

    async def backlog(self, refs: Sequence[ProcessorRef]) -> dict[str, int]:
        out: dict[str, int] = {}
        async with self._guard():
            for ref in refs:
                rows = await self._fetch(_PENDING, ref.name, ref.version,
                                         ref.stage.input_level,
                                         ref.rebacklog_on_version_bump)
                out[ref.label] = int(rows[0]["pending"])
        return out

    async def claim(self, ref: ProcessorRef, owner: str, limit: int, lease_ms: int,
                    now_ms: int) -> Claim:
        expires = now_ms + lease_ms
        async with self._guard():
            rows = await self._fetch(_CLAIM, ref.name, ref.version, now_ms, limit, owner,
                                     expires, CLOCK_HORIZON_MS)
        items = tuple(sorted(
            (Item(int(r["id"]), int(r["input_id"]), str(r["key"]), json.loads(r["payload"]),
                  int(r["input_rev"]), int(r["attempts"])) for r in rows),
            key=lambda item: item.work_id))
        token = int(rows[0]["fence"]) if rows else 0
        return Claim(ref, owner, token, items, expires)

    async def renew(self, claim: Claim, lease_ms: int, now_ms: int) -> int:
        expires = now_ms + lease_ms
        async with self._transaction():
            renewed = await self._count(_RENEW, expires, claim.token, now_ms)
            if renewed != len(claim.items):
                raise LeaseLost(f"lease {claim.token} of {claim.ref.label} was lost")
        return expires

    async def release(self, claim: Claim, now_ms: int) -> int:
        async with self._guard():
            return await self._count(_RELEASE, now_ms, claim.token)

    async def complete(self, claim: Claim, completions: Sequence[Completion],
                       now_ms: int) -> None:
        async with self._transaction():
            held = int((await self._fetch(_HELD, claim.token, now_ms))[0][0])
            if held != len(claim.items) or len(completions) != len(claim.items):
                raise LeaseLost(f"lease {claim.token} of {claim.ref.label} was lost; "
                                "nothing was written")
            await self._write_outputs(claim.ref, completions, now_ms)
            groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
            for done in completions:
                o = done.outcome
                retryable = None if o.kind != "failed" else int(o.retryable)
                groups[(done.state, o.kind, o.error, retryable, done.available_ms)].append(
                    done.work_id)
            for (state, kind, error, retryable, available), ids in groups.items():
                await self._fetch(_FINISH, state, kind, error, retryable, available, now_ms,
                                  claim.token, ids)

    async def _write_outputs(self, ref: ProcessorRef, completions: Sequence[Completion],
                             now_ms: int) -> None:
        level = ref.stage.output_level
        rows: dict[str, tuple[str, str | None, int]] = {}
        merges: dict[str, list[tuple[Output, int]]] = defaultdict(list)
        for done in completions:
            for out in done.outcome.outputs:
                if out.order is None:
                    rows[out.key] = (canonical(out.payload), None, done.input_id)
                else:
                    merges[out.key].append((out, done.input_id))
        if merges:
            rows.update(await self._merged(level, merges))
        if rows:
            keys = sorted(rows)
            await self._fetch(_REPLACE, level, ref.name, ref.version, now_ms, keys,
                              [rows[k][0] for k in keys], [rows[k][1] for k in keys],
                              [rows[k][2] for k in keys])

    async def _merged(self, level: int, merges: dict[str, list[tuple[Output, int]]]
                      ) -> dict[str, tuple[str, str | None, int]]:
        keys = sorted(merges)
        await self._fetch(_LOCK_KEY, [stable_key("runner.pipeline", self.location.schema,
                                                 str(level), key) for key in keys])
        rows = await self._fetch(
            "SELECT key, payload, orders FROM {s}.pipeline_records "
            "WHERE level = $1 AND key = ANY($2::text[])", level, keys)
        current = {str(r["key"]): (json.loads(r["payload"]), json.loads(r["orders"] or "{}"))
                   for r in rows}
        out: dict[str, tuple[str, str | None, int]] = {}
        for key in keys:
            payload, orders = current.get(key, (None, None))
            for output, _input in merges[key]:
                assert output.order is not None
                payload, orders = merge_fields(payload, orders, output.payload, output.order)
            out[key] = (canonical(payload), canonical(orders), merges[key][-1][1])
        return out
