"""Staged processing, written once (SPEC P1-P4, P6, P10, P11): processors and their
backlog, claims under leases, completions with versioned outputs, raw ingestion, cursors,
worker configurations and the level reports (``runner.pipeline.port.PipelineStore``).

Every write that ends or extends a claim names its fencing token, the state ``claimed``
and (but a release) an unexpired lease; a completion first checks that every item is
still held that way and otherwise writes nothing, so a worker that lost its lease
changes nothing.  Items that share an outcome are finished by one statement, so a batch
of no-op outcomes is a handful of statements whatever its size.

Raw ingestion writes D1 records under natural keys and never rewrites a known one, so
re-reading a range of the outbox (a lost cursor, a backfill, two retrievers) never
writes a second copy; the cursor only moves forward and only saves re-reading.

The dialect supplies the few steps whose algorithm differs (``if TYPE_CHECKING`` below):
how a batch is claimed (one statement with ``SKIP LOCKED`` on PostgreSQL, a
``BEGIN IMMEDIATE`` transaction on SQLite), the locks PostgreSQL takes where SQLite's
single writer needs none, the bulk record writes, and the wake-ups (``wakeups``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runner.errors import OutboxPruned, StoreUnavailable
from runner.io.engine.base import Db, Row
from runner.pipeline.model import (
    CLOCK_HORIZON_MS,
    FUNNEL_KEY_PREFIX,
    LEVELS,
    LeaseLost,
    LevelCounts,
    ProcessorRef,
    WorkerConfigView,
    canonical,
    merge_fields,
    stage_of,
)
from runner.retention import below_floor

if TYPE_CHECKING:  # built on the worker's path only: status never loads them
    from runner.pipeline.model import Claim, Completion, NewRecord, OutboxEvent, Output
    from runner.pipeline.retention import PipelinePrune

#: the schema version that keeps the outbox's prune floor (``outbox_retention``)
RETENTION_VERSION = 7
#: ``upto_seq`` when a read of the outbox has no upper bound
MAX_SEQ = 2**62
#: records per page of ``iter_level``
PAGE = 1000


class _DryRun(Exception):
    """Rolls a dry run's prune back."""


#: what a record write carries: payload, orders (merged records), the input it came from
_Record = tuple[str, str | None, int]


class PipelineOps(Db):
    schema_version: int
    _unreleased: list[tuple[int, int]]

    if TYPE_CHECKING:
        async def _claim_rows(self, params: Mapping[str, Any]) -> tuple[int, Sequence[Row]]:
            """Claim a batch: its fencing token, and the claimed items' rows (work id,
            input id, key, payload, input rev, attempts).  ``params``: name, version,
            owner, limit, now, expires, far (an ``available_at`` past it is due too)."""

        async def _hold_record_writers(self) -> None:
            """Inside a registration's transaction, before its backlog sync: keep every
            other record writer out until the commit."""

        async def _lock_merge_keys(self, level: int, keys: Sequence[str]) -> None:
            """Inside a completion's transaction: serialise merges of the same records."""

        async def _replace_records(self, rows: Sequence[Mapping[str, Any]],
                                   **common: Any) -> None:
            """Write ``replace_pipeline_records`` for ``rows`` (key, payload, orders,
            input_id), each with ``common`` (level, name, version, now)."""

        async def _ingest_records(self, records: Sequence[NewRecord], **common: Any
                                  ) -> int:
            """Write D1 records once each; how many were new.  ``common``: name,
            version, now."""

        async def _hold_pipeline_writers(self) -> None:
            """Inside a prune round's transaction: keep every other writer of records
            and work rows out until the commit."""

    # -- processors and backlog ----------------------------------------------------------

    async def register_processors(self, refs: Sequence[ProcessorRef], now_ms: int) -> None:
        async with self.transaction():
            for ref in refs:
                new = await self.fetch(
                    "register_pipeline_processor", name=ref.name, version=ref.version,
                    stage=ref.stage.value, level=ref.stage.input_level,
                    capability=ref.capability, rebacklog=ref.rebacklog_on_version_bump,
                    now=now_ms)
                if new:
                    await self._hold_record_writers()
                    await self._sync(ref, now_ms, force=False)

    async def sync_backlog(self, ref: ProcessorRef, now_ms: int, *, force: bool = False
                           ) -> int:
        async with self.transaction():
            return await self._sync(ref, now_ms, force=force)

    async def _sync(self, ref: ProcessorRef, now_ms: int, *, force: bool) -> int:
        count = max(await self.execute(
            "sync_pipeline_backlog", name=ref.name, version=ref.version, now=now_ms,
            level=ref.stage.input_level,
            all_inputs=force or ref.rebacklog_on_version_bump), 0)
        if force:
            count += max(await self.execute(
                "force_pipeline_replay", name=ref.name, version=ref.version, now=now_ms), 0)
        return count

    async def registered_processors(self) -> list[ProcessorRef]:
        rows = await self.fetch("current_pipeline_processors")
        return [ProcessorRef(str(r[0]), int(r[1]), stage_of(str(r[2])), str(r[3]), bool(r[4]))
                for r in rows]

    async def backlog(self, refs: Sequence[ProcessorRef]) -> dict[str, int]:
        out: dict[str, int] = {}
        for ref in refs:
            rows = await self.fetch(
                "pipeline_backlog", name=ref.name, version=ref.version,
                level=ref.stage.input_level, all_inputs=ref.rebacklog_on_version_bump)
            out[ref.label] = int(rows[0][0])
        return out

    # -- claims and leases ---------------------------------------------------------------

    async def claim(self, ref: ProcessorRef, owner: str, limit: int, lease_ms: int,
                    now_ms: int) -> Claim:
        from runner.pipeline.model import Claim, Item

        expires = now_ms + lease_ms
        token, rows = await self._claim_rows({
            "name": ref.name, "version": ref.version, "owner": owner, "limit": limit,
            "now": now_ms, "expires": expires, "far": now_ms + CLOCK_HORIZON_MS})
        items = sorted((Item(int(r[0]), int(r[1]), str(r[2]), json.loads(r[3]), int(r[4]),
                             int(r[5])) for r in rows), key=lambda item: item.work_id)
        return Claim(ref, owner, token, tuple(items), expires)

    async def renew(self, claim: Claim, lease_ms: int, now_ms: int) -> int:
        expires = now_ms + lease_ms
        async with self.transaction():
            renewed = await self.execute("renew_pipeline_lease", expires=expires,
                                         token=claim.token, now=now_ms)
            if renewed != len(claim.items):
                raise LeaseLost(f"lease {claim.token} of {claim.ref.label} was lost")
        return expires

    async def release(self, claim: Claim, now_ms: int) -> int:
        """Give a claim back (claimable at ``now_ms``).  A store whose session is lost
        gives it back once it has reconnected (``_reconnected``), instead of leaving it
        to its lease: by its token, so a claim taken over meanwhile, or completed by a
        commit whose answer was lost, is left as it is."""
        try:
            return max(await self.execute("release_pipeline_claim", now=now_ms,
                                          token=claim.token), 0)
        except StoreUnavailable:
            self._unreleased.append((claim.token, now_ms))
            raise

    async def _reconnected(self) -> None:
        while self._unreleased:
            token, at = self._unreleased[0]
            await self.execute("release_pipeline_claim", now=at, token=token)
            self._unreleased.pop(0)

    async def complete(self, claim: Claim, completions: Sequence[Completion],
                       now_ms: int) -> None:
        async with self.transaction():
            held = await self.fetch("held_pipeline_items", token=claim.token, now=now_ms)
            if int(held[0][0]) != len(claim.items) or len(completions) != len(claim.items):
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
                await self.fetch(
                    "finish_pipeline_work", state=state, outcome=kind, error=error,
                    retryable=retryable, available=available, now=now_ms,
                    token=claim.token, ids=ids)

    async def _write_outputs(self, ref: ProcessorRef, completions: Sequence[Completion],
                             now_ms: int) -> None:
        """The batch's outputs, one write per key (the last output of a key wins; a
        merged key's fields are merged in completion order)."""
        level = ref.stage.output_level
        records: dict[str, _Record] = {}
        merges: dict[str, list[tuple[Output, int]]] = defaultdict(list)
        for done in completions:
            for out in done.outcome.outputs:
                if out.order is None:
                    records[out.key] = (canonical(out.payload), None, done.input_id)
                else:
                    merges[out.key].append((out, done.input_id))
        if merges:
            records.update(await self._merged(level, merges))
        if records:
            await self._replace_records(
                [{"key": key, "payload": records[key][0], "orders": records[key][1],
                  "input_id": records[key][2]} for key in sorted(records)],
                level=level, name=ref.name, version=ref.version, now=now_ms)

    async def _merged(self, level: int, merges: dict[str, list[tuple[Output, int]]]
                      ) -> dict[str, _Record]:
        keys = sorted(merges)
        await self._lock_merge_keys(level, keys)
        rows = await self.fetch("pipeline_records_by_key", level=level, keys=keys)
        current = {str(r[0]): (json.loads(r[1]), json.loads(r[2] or "{}")) for r in rows}
        out: dict[str, _Record] = {}
        for key in keys:
            payload, orders = current.get(key, (None, None))
            for output, _input in merges[key]:
                assert output.order is not None
                payload, orders = merge_fields(payload, orders, output.payload, output.order)
            out[key] = (canonical(payload), canonical(orders), merges[key][-1][1])
        return out

    # -- raw ingestion and cursors --------------------------------------------------------

    async def read_outbox(self, after_seq: int, limit: int, upto_seq: int | None = None
                          ) -> list[OutboxEvent]:
        from runner.pipeline.model import OutboxEvent

        rows = await self.fetch("read_pipeline_outbox", after=after_seq, limit=limit,
                                upto=MAX_SEQ if upto_seq is None else upto_seq)
        # after the read, which it vouches for: the floor only moves up, in the
        # transaction that deletes, so a floor still at or below after_seq now proves
        # that the read saw no deletion above it
        if self.schema_version >= RETENTION_VERSION:
            floor = await self.fetch("pipeline_outbox_floor")
            if floor and (why := below_floor(after_seq, int(floor[0][0]))) is not None:
                raise OutboxPruned(why)
        return [OutboxEvent(int(r[0]), str(r[1]), r[2], json.loads(r[3]), str(r[4]), r[5])
                for r in rows]

    async def ingest(self, records: Sequence[NewRecord], source: tuple[str, int],
                     cursor: str | None, position: int | None, now_ms: int) -> int:
        name, version = source
        async with self.transaction():
            new = 0
            if records:
                new = await self._ingest_records(records, name=name, version=version,
                                                 now=now_ms)
            if cursor is not None and position is not None:
                await self.execute("move_pipeline_cursor", name=cursor, position=position,
                                   now=now_ms)
        return max(new, 0)

    async def cursor_position(self, cursor: str) -> int:
        rows = await self.fetch("pipeline_cursor_position", name=cursor)
        return int(rows[0][0]) if rows else 0

    async def outbox_last_seq(self) -> int:
        return int((await self.fetch("pipeline_outbox_last_seq"))[0][0])

    async def outbox_pending(self, after_seq: int, kinds: Sequence[str]) -> int:
        count, _ = await self._outbox_pending(after_seq, kinds)
        return count

    async def raw_pending(self, kinds: Sequence[str]) -> int:
        if not kinds:
            return 0
        rows = await self.fetch("pipeline_raw_pending", kinds=list(kinds))
        return int(rows[0][0])

    async def outbox_first_pending(self, after_seq: int, kinds: Sequence[str]) -> int | None:
        _, first = await self._outbox_pending(after_seq, kinds)
        return first

    async def _outbox_pending(self, after_seq: int, kinds: Sequence[str]
                              ) -> tuple[int, int | None]:
        if not kinds:
            return 0, None
        rows = await self.fetch("pipeline_outbox_pending", after=after_seq, kinds=list(kinds))
        first = rows[0][1]
        return int(rows[0][0]), None if first is None else int(first)

    # -- worker configurations -----------------------------------------------------------

    async def record_worker_config(self, view: WorkerConfigView) -> None:
        await self.execute(
            "save_pipeline_worker_config", worker=view.worker,
            desired=None if view.desired is None else canonical(view.desired),
            effective=canonical(view.effective), error=view.error, at=view.updated_at)

    async def worker_configs(self) -> list[WorkerConfigView]:
        rows = await self.fetch("pipeline_worker_configs")
        return [WorkerConfigView(str(r[0]), None if r[1] is None else json.loads(r[1]),
                                 json.loads(r[2]), r[3], str(r[4])) for r in rows]

    # -- levels ----------------------------------------------------------------------------

    async def level_counts(self) -> LevelCounts:
        rows = await self.fetch("pipeline_level_counts")
        counts = dict.fromkeys(LEVELS, 0)
        counts.update({int(r[0]): int(r[1]) for r in rows})
        history = counts.pop(0, 0)
        return LevelCounts(counts, history)

    async def funnel(self) -> dict[str, dict[str, int]]:
        rows = await self.fetch("pipeline_funnel", prefix=FUNNEL_KEY_PREFIX,
                                prefix_end=FUNNEL_KEY_PREFIX[:-1] + ";")
        out: dict[str, dict[str, int]] = {}
        for form, status, count in rows:
            out.setdefault(str(form), {})[str(status)] = int(count)
        return out

    async def iter_level(self, level: int
                         ) -> AsyncIterator[tuple[str, Mapping[str, Any], int]]:
        after = ""
        while True:
            rows = await self.fetch("pipeline_level_page", level=level, after=after,
                                    limit=PAGE)
            for key, payload, rev in rows:
                yield str(key), json.loads(payload), int(rev)
            if len(rows) < PAGE:
                return
            after = str(rows[-1][0])

    # -- retention (schema v10, ``runner.pipeline.retention``) ---------------------------

    async def prune_pipeline(self, before_ms: int, at: str, *, dry_run: bool = False,
                             batch: int | None = None) -> PipelinePrune:
        """Remove what is finished and older than ``before_ms`` (``runner.pipeline.
        retention``), in rounds of at most ``batch`` records per level, each one
        transaction; ``dry_run``: every round in one transaction, rolled back."""
        from runner.errors import UsageError
        from runner.pipeline.retention import (
            PIPELINE_RETENTION_VERSION,
            PRUNE_BATCH,
            PipelinePrune,
        )

        if self.schema_version < PIPELINE_RETENTION_VERSION:
            raise UsageError(f"this store is at schema version {self.schema_version}; "
                             f"pipeline prune needs {PIPELINE_RETENTION_VERSION}")
        limit = batch or PRUNE_BATCH
        removed: dict[str, int] = defaultdict(int)
        rounds, floor = 0, 0
        if dry_run:
            try:
                async with self.transaction():
                    while True:
                        rounds += 1
                        floor, more = await self._prune_round(before_ms, limit, removed,
                                                              None)
                        if not more:
                            break
                    raise _DryRun
            except _DryRun:
                pass
        else:
            more = True
            while more:
                rounds += 1
                async with self.transaction():
                    floor, more = await self._prune_round(before_ms, limit, removed, at)
        return PipelinePrune(_text_of_ms(before_ms), dry_run, rounds, floor, dict(removed))

    async def _prune_round(self, before_ms: int, limit: int, removed: dict[str, int],
                           at: str | None) -> tuple[int, bool]:
        """One round, inside a transaction: levels from the top down (so a record's
        outputs go before it), then old history.  The outbox floor and whether anything
        was removed (``at``: record the round in ``pipeline_prunes``)."""
        await self._hold_pipeline_writers()
        rows = await self.fetch("pipeline_outbox_floor")
        floor = int(rows[0][0]) if rows else 0
        now: dict[str, int] = defaultdict(int)
        for level in (3, 2, 1):
            ids = [int(r[0]) for r in await self.fetch(
                "pipeline_prune_candidates", level=level, before=before_ms, floor=floor,
                limit=limit)]
            if not ids:
                continue
            now["outcome_history"] += max(await self.execute(
                "prune_pipeline_outcome_history_of", ids=ids), 0)
            now["work"] += max(await self.execute("prune_pipeline_work_of", ids=ids), 0)
            now["history"] += max(await self.execute("prune_pipeline_history_of",
                                                     ids=ids), 0)
            now[f"D{level}"] += max(await self.execute("prune_pipeline_records",
                                                       ids=ids), 0)
        now["history"] += max(await self.execute(
            "prune_old_pipeline_history", before=before_ms, limit=limit), 0)
        now["outcome_history"] += max(await self.execute(
            "prune_old_pipeline_outcome_history", before=before_ms, limit=limit), 0)
        for kind, n in now.items():
            removed[kind] += n
        total = sum(now.values())
        if total and at is not None:
            await self.execute("record_pipeline_prune", before=before_ms, at=at,
                               removed=json.dumps({k: n for k, n in sorted(now.items())
                                                   if n}))
        return floor, total > 0


def _text_of_ms(ms: int) -> str:
    from datetime import UTC, datetime

    from runner.clock import to_text

    return to_text(datetime.fromtimestamp(ms / 1000, UTC))
