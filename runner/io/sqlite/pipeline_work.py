"""Pipeline claims, leases and outcomes for SQLite (SPEC P2-P4).

A claim is one ``BEGIN IMMEDIATE`` transaction: take a new fencing token from
``pipeline_fence``, then one ``UPDATE … RETURNING`` marks up to ``limit`` claimable rows
(pending and due, or claimed under a lease that has run out) as ours, with the token and
the lease expiry, found through the partial index that holds only non-terminal rows.
The write lock of ``BEGIN IMMEDIATE`` is what keeps two claimers off the same rows.

Every write that ends or extends a claim names the token, the state ``claimed`` and an
unexpired lease in its WHERE clause; a completion first checks that every item is still
held that way and otherwise rolls back, so a worker that lost its lease writes nothing.
Items that share an outcome are finished by one UPDATE, so a batch of no-op outcomes is
a handful of statements whatever its size.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner.io.sqlite.base import SQLiteBase
from runner.pipeline.model import (
    CLOCK_HORIZON_MS,
    LeaseLost,
    ProcessorRef,
    canonical,
    merge_fields,
    stage_of,
)

if TYPE_CHECKING:  # claim() imports what it builds: status, on this path, never needs them
    from runner.pipeline.work import Claim, Completion, Output

_REGISTER = """
INSERT INTO pipeline_processors
    (name, version, stage, input_level, capability, rebacklog, registered_ms)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name, version) DO NOTHING
RETURNING name
"""
_CURRENT = """
SELECT name, version, stage, capability, rebacklog FROM pipeline_processors p
WHERE NOT EXISTS (SELECT 1 FROM pipeline_processors q
                  WHERE q.name = p.name AND q.version > p.version)
ORDER BY input_level, name
"""
_SYNC = """
INSERT INTO pipeline_work (input_id, processor, version, state, available_at, input_rev)
SELECT r.id, :name, :version, 'pending', :now, r.rev FROM pipeline_records r
WHERE r.level = :level
  AND (:all OR NOT EXISTS (SELECT 1 FROM pipeline_work o
                           WHERE o.input_id = r.id AND o.processor = :name
                             AND o.state = 'done'))
ON CONFLICT (input_id, processor, version) DO NOTHING
"""
_FORCE = """
UPDATE pipeline_work SET state = 'pending', available_at = :now
WHERE processor = :name AND version = :version AND state = 'done'
"""
_PENDING_ROWS = """
SELECT count(*) FROM pipeline_work
WHERE processor = :name AND version = :version AND state <> 'done'
"""
_PENDING_UNQUEUED = """
SELECT count(*) FROM pipeline_records r
WHERE r.level = :level
  AND NOT EXISTS (SELECT 1 FROM pipeline_work w WHERE w.input_id = r.id
                  AND w.processor = :name AND w.version = :version)
  AND (:all OR NOT EXISTS (SELECT 1 FROM pipeline_work o
                           WHERE o.input_id = r.id AND o.processor = :name
                             AND o.state = 'done'))
"""
_NEXT_FENCE = "UPDATE pipeline_fence SET last = last + 1 WHERE one = 1 RETURNING last"
_CLAIM = """
UPDATE pipeline_work
SET state = 'claimed', owner = :owner, fence = :token, available_at = :expires,
    attempts = attempts + 1,
    input_rev = (SELECT r.rev FROM pipeline_records r WHERE r.id = pipeline_work.input_id)
WHERE id IN (SELECT id FROM pipeline_work
             WHERE processor = :name AND version = :version AND state <> 'done'
               AND (available_at <= :now OR available_at > :far)
             ORDER BY available_at LIMIT :limit)
RETURNING id
"""
_CLAIMED_ITEMS = """
SELECT w.id, r.id, r.key, r.payload, w.input_rev, w.attempts
FROM pipeline_work w JOIN pipeline_records r ON r.id = w.input_id
WHERE w.fence = ? AND w.state = 'claimed'
ORDER BY w.id
"""
_HELD = """
SELECT count(*) FROM pipeline_work
WHERE fence = ? AND state = 'claimed' AND available_at >= ?
"""
_RENEW = """
UPDATE pipeline_work SET available_at = ?
WHERE fence = ? AND state = 'claimed' AND available_at >= ?
"""
_RELEASE = """
UPDATE pipeline_work SET state = 'pending', available_at = ?
WHERE fence = ? AND state = 'claimed'
"""
# an input that changed since the claim read it goes back to the backlog
_FINISH = """
UPDATE pipeline_work
SET state = CASE WHEN ? = 'done' AND input_rev IS NOT
                      (SELECT r.rev FROM pipeline_records r WHERE r.id = pipeline_work.input_id)
                 THEN 'pending' ELSE ? END,
    outcome = ?, error = ?, retryable = ?, available_at = ?, done_ms = ?
WHERE fence = ? AND state = 'claimed' AND id IN ({ids})
"""
_REPLACE = """
INSERT INTO pipeline_records
    (level, key, payload, orders, processor, version, input_id, updated_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (level, key) DO UPDATE
SET rev = rev + (payload IS NOT excluded.payload), payload = excluded.payload,
    orders = excluded.orders, processor = excluded.processor, version = excluded.version,
    input_id = excluded.input_id, updated_ms = excluded.updated_ms
WHERE payload IS NOT excluded.payload OR orders IS NOT excluded.orders
"""
_CHUNK = 500


class PipelineWorkQueries(SQLiteBase):
    async def register_processors(self, refs: Sequence[ProcessorRef], now_ms: int) -> None:
        async with self._transaction():
            for ref in refs:
                new = await self._fetchall(_REGISTER, (
                    ref.name, ref.version, ref.stage.value, ref.stage.input_level,
                    ref.capability, int(ref.rebacklog_on_version_bump), now_ms))
                if new:
                    await self._sync(ref, now_ms, force=False)

    async def sync_backlog(self, ref: ProcessorRef, now_ms: int, *, force: bool = False
                           ) -> int:
        async with self._transaction():
            return await self._sync(ref, now_ms, force=force)

    async def _sync(self, ref: ProcessorRef, now_ms: int, *, force: bool) -> int:
        params = {"name": ref.name, "version": ref.version, "now": now_ms,
                  "level": ref.stage.input_level,
                  "all": int(force or ref.rebacklog_on_version_bump)}
        count = max(await self._executemany(_SYNC, [params]), 0)
        if force:
            count += max(await self._executemany(_FORCE, [
                {"name": ref.name, "version": ref.version, "now": now_ms}]), 0)
        return count

    async def registered_processors(self) -> list[ProcessorRef]:
        async with self._guard():
            rows = await self._fetchall(_CURRENT)
        return [ProcessorRef(str(r[0]), int(r[1]), stage_of(str(r[2])), str(r[3]), bool(r[4]))
                for r in rows]

    async def backlog(self, refs: Sequence[ProcessorRef]) -> dict[str, int]:
        out: dict[str, int] = {}
        async with self._guard():
            for ref in refs:
                params = {"name": ref.name, "version": ref.version}
                queued = await self._fetchall(_PENDING_ROWS, params)
                unqueued = await self._fetchall(_PENDING_UNQUEUED, {
                    **params, "level": ref.stage.input_level,
                    "all": int(ref.rebacklog_on_version_bump)})
                out[ref.label] = int(queued[0][0]) + int(unqueued[0][0])
        return out

    async def claim(self, ref: ProcessorRef, owner: str, limit: int, lease_ms: int,
                    now_ms: int) -> Claim:
        from runner.pipeline.work import Claim, Item

        expires = now_ms + lease_ms
        async with self._transaction():
            token = int((await self._fetchall(_NEXT_FENCE))[0][0])
            taken = await self._fetchall(_CLAIM, {
                "owner": owner, "token": token, "expires": expires, "name": ref.name,
                "version": ref.version, "now": now_ms, "limit": limit,
                "far": now_ms + CLOCK_HORIZON_MS})
            rows = await self._fetchall(_CLAIMED_ITEMS, (token,)) if taken else []
        items = tuple(Item(int(r[0]), int(r[1]), str(r[2]), json.loads(r[3]), int(r[4]),
                           int(r[5])) for r in rows)
        return Claim(ref, owner, token, items, expires)

    async def renew(self, claim: Claim, lease_ms: int, now_ms: int) -> int:
        expires = now_ms + lease_ms
        async with self._transaction():
            renewed = await self._executemany(_RENEW, [(expires, claim.token, now_ms)])
            if renewed != len(claim.items):
                raise LeaseLost(f"lease {claim.token} of {claim.ref.label} was lost")
        return expires

    async def release(self, claim: Claim, now_ms: int) -> int:
        async with self._guard():
            return max(await self._executemany(_RELEASE, [(now_ms, claim.token)]), 0)

    async def complete(self, claim: Claim, completions: Sequence[Completion],
                       now_ms: int) -> None:
        async with self._transaction():
            held = int((await self._fetchall(_HELD, (claim.token, now_ms)))[0][0])
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
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start : start + _CHUNK]
                    await self._fetchall(
                        _FINISH.format(ids=",".join("?" * len(chunk))),
                        (state, state, kind, error, retryable, available, now_ms,
                         claim.token, *chunk))

    async def _write_outputs(self, ref: ProcessorRef, completions: Sequence[Completion],
                             now_ms: int) -> None:
        level = ref.stage.output_level
        replace: list[tuple[Any, ...]] = []
        merges: dict[str, list[tuple[Output, int]]] = defaultdict(list)
        for done in completions:
            for out in done.outcome.outputs:
                if out.order is None:
                    replace.append((level, out.key, canonical(out.payload), None, ref.name,
                                    ref.version, done.input_id, now_ms))
                else:
                    merges[out.key].append((out, done.input_id))
        if merges:
            replace += await self._merged(ref, level, merges, now_ms)
        if replace:
            await self._executemany(_REPLACE, replace)

    async def _merged(self, ref: ProcessorRef, level: int,
                      merges: dict[str, list[tuple[Output, int]]], now_ms: int
                      ) -> list[tuple[Any, ...]]:
        keys = sorted(merges)
        current: dict[str, tuple[Any, Any]] = {}
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            rows = await self._fetchall(
                "SELECT key, payload, orders FROM pipeline_records "
                f"WHERE level = ? AND key IN ({','.join('?' * len(chunk))})", (level, *chunk))
            current.update({str(r[0]): (json.loads(r[1]), json.loads(r[2] or "{}"))
                            for r in rows})
        out = []
        for key in keys:
            payload, orders = current.get(key, (None, None))
            for output, _input in merges[key]:
                assert output.order is not None
                payload, orders = merge_fields(payload, orders, output.payload, output.order)
            input_id = merges[key][-1][1]
            out.append((level, key, canonical(payload), canonical(orders), ref.name,
                        ref.version, input_id, now_ms))
        return out
