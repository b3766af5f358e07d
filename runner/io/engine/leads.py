"""Lead intake and the record reads (SPEC L3, L13): accept, bulk accept, the record list
and the store summary that ``status`` shows.

Accept is one statement for a new key: the record's outbox row is written by a trigger,
so the insert is its own transaction.  A key already stored costs one more read, and the
outcome (``duplicate`` or ``conflict``) is decided here from the stored canonical JSON.

A bulk accept inserts a group and learns which keys were new through the dialect's hook
``_insert_new`` (SQLite: multi-row ``VALUES`` with ``RETURNING`` or ``changes()``;
PostgreSQL: ``unnest``), then reads the stored records of the others in one statement.
The outcomes are those of accepting the items one by one in order: a key that appears
twice is inserted once, first.

Also here: the poll pass's writes (``PollOps``), operators' decisions
(``OperatorOps``), the outbox's retention (``RetentionOps``) and the ``/metrics`` figures
(``FigureOps``): one module, since ``status`` pays for every module it imports."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runner.clock import to_text
from runner.errors import OutboxPruned, RunnerError
from runner.figures import LeadFigures
from runner.ids import WriteId
from runner.io.engine.base import Db, Row
from runner.io.engine.delivery import lead_work, lead_works
from runner.leads.states import IllegalTransition, LeadState, check_transition
from runner.retention import PruneFacts, PruneResult, RetentionState, below_floor, plan_prune
from runner.storedata import LeadRow, ScopeData, StoreSummary, UncertainRow

if TYPE_CHECKING:
    from runner.leads.models import LeadEvent
    from runner.storedata import (
        AcceptItem,
        AcceptOutcome,
        Decision,
        DecisionBatch,
        ObservationWrite,
        PollTarget,
        ResolveSubject,
    )


#: how many poll-health runs and operator decisions ``status`` shows, newest first
SHOWN = 20
Key = tuple[str, str]  # (tenant_id, source_lead_id)


def lead_row(row: Row) -> LeadRow:
    """A ``record_page``/``find_lead`` row as a LeadRow."""
    return LeadRow(
        seq=int(row[0]),
        tenant_id=str(row[1]),
        source_lead_id=str(row[2]),
        write_id=WriteId(str(row[3])),
        state=LeadState(row[4]),
        attempts=int(row[5]),
        reconcile_attempts=int(row[6]),
        snapshot=json.loads(row[7]) if row[7] is not None else None,
        last_polled_at=row[8],
        contact_alias_present=bool(row[9]),
        last_error=row[10],
        last_failure=row[11],
    )


def _outcome(stored_write_id: str, stored_canonical: str, canonical: str) -> AcceptOutcome:
    """An existing record's answer: the same event again, or another under its key."""
    from runner.storedata import AcceptOutcome  # the write path's data (not status's)

    same = stored_canonical == canonical
    return AcceptOutcome("duplicate" if same else "conflict", WriteId(stored_write_id))


def _never_deleted() -> RunnerError:
    return RunnerError("accept found neither a new nor an existing record")


class LeadOps(Db):
    scope_data: ScopeData | None
    schema_version: int

    if TYPE_CHECKING:
        async def _insert_new(self, items: Sequence[AcceptItem], at: str) -> set[str]:
            """Hook: insert the items (ON CONFLICT DO NOTHING, in order, a group as one
            transaction); the write_ids that went in."""
            ...

        async def retention_state(self) -> RetentionState: ...

    async def accept(
        self, event: LeadEvent, canonical: str, write_id: WriteId, now: datetime
    ) -> AcceptOutcome:
        from runner.storedata import AcceptOutcome

        key = {"tenant_id": event.tenant_id, "source_lead_id": event.source_lead_id}
        rows = await self.fetch("accept_lead", **key, canonical=canonical,
                                write_id=write_id, at=to_text(now))
        if not rows:  # the key was stored (on PostgreSQL: by a transaction that committed
            # while this insert waited for it, which its snapshot cannot see)
            rows = await self.fetch("accept_existing", **key)
        if not rows:  # records are never deleted, so this cannot happen
            raise _never_deleted()
        new, stored_write_id, stored_canonical = rows[0]
        if new:
            return AcceptOutcome("accepted", WriteId(str(stored_write_id)))
        return _outcome(str(stored_write_id), str(stored_canonical), canonical)

    async def accept_many(
        self, items: Sequence[AcceptItem], now: datetime
    ) -> list[AcceptOutcome]:
        from runner.storedata import AcceptOutcome

        if not items:
            return []
        inserted = await self._insert_new(items, to_text(now))
        if len(inserted) == len(items):  # every key was new (the common bulk case)
            return [AcceptOutcome("accepted", it.write_id) for it in items]
        stored: dict[Key, tuple[str, str]] = {}
        if len(inserted) < len(items):  # a new statement: it sees what others committed
            keys = dict.fromkeys((it.event.tenant_id, it.event.source_lead_id)
                                 for it in items if it.write_id not in inserted)
            rows = await self.fetch("leads_by_keys", keys=[list(key) for key in keys])
            stored = {(str(r[0]), str(r[1])): (str(r[3]), str(r[2])) for r in rows}
        outcomes: list[AcceptOutcome] = []
        for it in items:
            if it.write_id in inserted:
                outcomes.append(AcceptOutcome("accepted", it.write_id))
                continue
            found = stored.get((it.event.tenant_id, it.event.source_lead_id))
            if found is None:  # records are never deleted, so this cannot happen
                raise _never_deleted()
            outcomes.append(_outcome(*found, it.canonical))
        return outcomes

    async def iter_records(self, *, state: LeadState | None = None, page: int = 1000
                           ) -> AsyncGenerator[LeadRow, None]:
        after = 0
        while True:
            # keyset pages: each page is one short read by index, so a million records
            # cost a thousand small fetches, never one result held whole
            if state is None:
                rows = await self.fetch("record_page", after_seq=after, limit=page)
            else:
                rows = await self.fetch("record_page_in_state", state=state.value,
                                        after_seq=after, limit=page)
            for row in rows:
                yield lead_row(row)
            if len(rows) < page:
                return
            after = int(rows[-1][0])

    async def summary(self) -> StoreSummary:
        (row,) = await self.fetch("store_summary", shown=SHOWN)
        retention = await self.retention_state()
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(state): int(n) for state, n in json.loads(row[0]).items()})
        by_kind = {str(kind): int(n) for kind, n in json.loads(row[1]).items()}
        pruned = None if retention.floor == 0 else {
            "floor": retention.floor, "count": retention.pruned,
            "by_kind": retention.pruned_by_kind}
        return StoreSummary(
            scope=self.scope_data,
            schema_version=self.schema_version,
            counts=counts,
            outbox_count=sum(by_kind.values()),
            outbox_last_seq=int(row[2]),
            outbox_by_kind=by_kind,
            poll_health=json.loads(row[3]),
            outbox_pruned=pruned,
            decisions=json.loads(row[4]),
            retries=json.loads(row[5]),
        )


# -- the poll pass's writes (L11, L12) -----------------------------------------------

MISSING_SNAPSHOT = '{"missing":true}'


class PollOps(Db):
    if TYPE_CHECKING:
        async def _lock_poll_health(self) -> None:
            """Hook, inside the pass's transaction: keep other processes' passes out of
            the poll-health runs until it commits."""
            ...

    async def poll_page(self, limit: int) -> list[PollTarget]:
        from runner.storedata import PollTarget  # the poller's data (not status's)

        rows = await self.fetch("poll_page", limit=limit)
        return [PollTarget(int(r[0]), str(r[1]), WriteId(str(r[2])), r[3]) for r in rows]

    async def find_lead(self, tenant_id: str, source_lead_id: str) -> LeadRow | None:
        rows = await self.fetch("find_lead", tenant_id=tenant_id, source_lead_id=source_lead_id)
        return lead_row(rows[0]) if rows else None

    async def lead_snapshot(self, write_id: WriteId) -> tuple[LeadState, str | None] | None:
        rows = await self.fetch("lead_snapshot", write_id=write_id)
        return (LeadState(rows[0][0]), rows[0][1]) if rows else None

    async def apply_observations(self, writes: Sequence[ObservationWrite], now: datetime) -> int:
        if not writes:
            return 0
        async with self.transaction():
            return await self._observations(writes, to_text(now))

    async def record_poll_pass(
        self, writes: Sequence[ObservationWrite], failure: str | None, now: datetime
    ) -> tuple[int, bool]:
        at = to_text(now)
        async with self.transaction():
            # time that went backwards: a poll time after ``now`` counts as ``now``, so
            # the records polled "in the future" take their turn again (oldest poll first)
            await self.fetch("clamp_poll_times", at=at)
            changed = await self._observations(writes, at) if writes else 0
            return changed, await self._poll_health(failure, at)

    async def _observations(self, writes: Sequence[ObservationWrite], at: str) -> int:
        """Inside a transaction; returns how many snapshots really changed."""
        changes = [[w.write_id, w.snapshot] for w in writes if w.outcome == "changed"]
        changed = len(await self.fetch("observe_changed", at=at, changes=changes)) if changes else 0
        await self.fetch("observe_polled", at=at, write_ids=[w.write_id for w in writes])
        if missing := [w.write_id for w in writes if w.outcome == "missing"]:
            await self.fetch("observe_missing", at=at, write_ids=missing,
                             missing_snapshot=MISSING_SNAPSHOT)
        return changed

    async def _poll_health(self, failure: str | None, at: str) -> bool:
        """Inside a transaction: extend the open run if it is the same failure, else close
        it and (for a failure) open a new one, whose trigger writes the event."""
        await self._lock_poll_health()
        open_runs = await self.fetch("open_poll_run")
        current = open_runs[0] if open_runs else None
        if current is not None and current[1] == failure:
            await self.fetch("extend_poll_run", at=at, run=current[0])
            return False
        if current is not None:
            await self.fetch("close_poll_run", at=at, run=current[0])
        if failure is None:
            return False
        await self.fetch("start_poll_run", failure=failure, at=at)
        return True


# -- operators: uncertain records and decisions (E5) ---------------------------------

class OperatorOps(Db):
    async def uncertain_records(self, after_seq: int, limit: int) -> list[UncertainRow]:
        rows = await self.fetch("uncertain_records", after_seq=after_seq, limit=limit)
        return [UncertainRow(
            seq=int(r[0]), source_lead_id=str(r[1]), write_id=WriteId(str(r[2])),
            attempts=int(r[3]), reconcile_attempts=int(r[4]), uncertain_since=r[5],
            last_reconcile=r[6], last_reconcile_at=r[7], last_error=r[8],
            last_failure=r[9]) for r in rows]

    async def resolve_subject(self, write_id: WriteId) -> ResolveSubject | None:
        from runner.storedata import ResolveSubject

        rows = await self.fetch("resolve_subject", write_id=write_id)
        if not rows:
            return None
        row = rows[0]  # seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
        return ResolveSubject(work=lead_work(row), tenant_id=str(row[5]),
                              attempts=int(row[6]))

    async def record_operator_decision(self, decision: Decision, now: datetime) -> None:
        check_transition(LeadState.UNCERTAIN, decision.to_state)
        at = to_text(now)
        async with self.transaction():
            await self.fetch(
                "record_operator_decision", tenant_id=decision.tenant_id,
                source_lead_id=decision.source_lead_id, write_id=decision.write_id,
                decision=decision.decision, reason=decision.reason,
                readback=decision.readback, attempts=decision.attempts, at=at)
            moved = await self.fetch(
                "leave_uncertain", state=decision.to_state.value, at=at,
                write_id=decision.write_id, attempts=decision.attempts)
            if not moved:  # rolls the decision back too
                raise IllegalTransition(
                    f"record {decision.write_id} is no longer uncertain at attempts "
                    f"{decision.attempts}")

    async def resolve_page(self, after_seq: int, limit: int, *,
                           in_flight: bool = False) -> list[ResolveSubject]:
        from runner.storedata import ResolveSubject

        rows = await self.fetch("resolve_page", after_seq=after_seq, limit=limit,
                                in_flight=in_flight)
        works = lead_works(rows)  # seq, source_lead_id, write_id, state, canonical, ...
        return [ResolveSubject(work=work, tenant_id=str(row[5]), attempts=int(row[6]))
                for work, row in zip(works, rows, strict=True)]

    async def record_operator_decisions(self, batch: DecisionBatch, now: datetime
                                        ) -> set[WriteId]:
        """Two set-based statements in one transaction: the decision rows of the records
        still uncertain at their attempts (their events by trigger), then those records'
        move; a move that misses a decided record rolls the chunk back."""
        check_transition(LeadState.UNCERTAIN, batch.to_state)
        wanted = dict(batch.records)  # one decision per record, whatever the caller gave
        if not wanted:
            return set()
        at = to_text(now)
        async with self.transaction():
            rows = await self.fetch(
                "record_operator_decisions", decision=batch.decision, reason=batch.reason,
                readback=batch.readback, at=at, write_ids=[str(w) for w in wanted],
                attempts=list(wanted.values()))
            decided = [WriteId(str(r[0])) for r in rows]
            if not decided:
                return set()
            moved = await self.fetch(
                "leave_uncertain_many", state=batch.to_state.value, at=at,
                write_ids=[str(w) for w in decided], attempts=[wanted[w] for w in decided])
            if len(moved) != len(decided):  # rolls the decisions back too
                raise IllegalTransition(
                    f"{len(decided) - len(moved)} record(s) changed while their decisions "
                    "were recorded")
        return set(decided)


# -- the outbox's retention: export, watermark, prune (schema v7) --------------------

RETENTION_VERSION = 7
#: ``runner.pipeline.stages.raw_ingestion.CURSOR`` (the schemas' ``RETRIEVER_CURSOR``)
_CURSOR = "raw-retriever:outbox"


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


class RetentionOps(Db):
    schema_version: int

    async def check_outbox_floor(self, after_seq: int) -> None:
        """Raise OutboxPruned if events after ``after_seq`` were pruned (call after the
        read it vouches for)."""
        floor = 0
        if self.schema_version >= RETENTION_VERSION:
            rows = await self.fetch("outbox_floor")
            floor = int(rows[0][0]) if rows else 0
        if (why := below_floor(after_seq, floor)) is not None:
            raise OutboxPruned(why)

    async def export_outbox(self, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Events after ``after_seq`` in sequence order, at most ``limit``, whole."""
        rows = await self.fetch("export_outbox", after_seq=after_seq, limit=limit)
        await self.check_outbox_floor(after_seq)
        return [{"seq": int(r[0]), "kind": str(r[1]), "subject": r[2],
                 "payload": json.loads(r[3]), "at": str(r[4])} for r in rows]

    async def retention_state(self) -> RetentionState:
        if self.schema_version < RETENTION_VERSION:
            return RetentionState(0, None, 0, {})  # nothing pruned, no watermark
        head = await self.fetch("retention_head")
        prunes = await self.fetch("outbox_prunes")
        by_kind: dict[str, int] = {}
        for _, kinds in prunes:
            for kind, n in json.loads(kinds).items():
                by_kind[kind] = by_kind.get(kind, 0) + int(n)
        floor, watermark = head[0] if head else (0, None)
        return RetentionState(int(floor), _count(watermark),
                              sum(int(r[0]) for r in prunes), by_kind)

    async def set_export_watermark(self, seq: int, at: str) -> int:
        """Record the export watermark (forward only; the trigger refuses a step back or a
        seq past the newest event).  Returns the watermark now recorded."""
        async with self.transaction():
            await self.execute("advance_export_watermark", seq=seq, at=at)
            rows = await self.fetch("export_watermark")
        return int(rows[0][0])

    async def prune_outbox(self, before: int, kinds: Sequence[str], at: str) -> PruneResult:
        """Remove events with ``seq < before`` within every bound (``runner.retention``);
        ``kinds`` are the lead kinds the raw retriever must have ingested first."""
        async with self.transaction():
            floor, watermark, cursor, last = (await self.fetch("prune_facts", cursor=_CURSOR))[0]
            first = (await self.fetch("first_uningested", floor=floor, cursor=cursor,
                                      kinds=list(kinds)))[0][0] if kinds else None
            facts = PruneFacts(int(floor), _count(watermark), int(cursor), _count(first),
                               int(last))
            plan = plan_prune(before, facts)
            by_kind: dict[str, int] = {}
            if plan.floor > facts.floor:
                counted = await self.fetch("outbox_kinds_between", after_seq=facts.floor,
                                           upto=plan.floor)
                by_kind = {str(kind): int(n) for kind, n in counted}
                await self.execute("set_outbox_floor", floor=plan.floor, at=at)
                await self.execute("delete_outbox_upto", floor=plan.floor)
                await self.execute(
                    "record_prune", from_floor=facts.floor, to_floor=plan.floor,
                    removed=sum(by_kind.values()), by_kind=json.dumps(by_kind, sort_keys=True),
                    limited_by=plan.limited_by, at=at)
        return PruneResult(sum(by_kind.values()), plan.floor, facts.floor, plan.limited_by,
                           by_kind)


# -- the figures for /metrics --------------------------------------------------------

class FigureOps(Db):
    async def lead_figures(self) -> LeadFigures:
        async with self.reading():
            rows = await self.fetch("lead_counts")
            oldest = await self.fetch("oldest_uncertain_accepted_at")
            failing = await self.fetch("open_poll_failure_since")
        counts = {state: 0 for state in LeadState}
        counts.update({LeadState(r[0]): int(r[1]) for r in rows})
        return LeadFigures(counts, str(oldest[0][0]) if oldest else None,
                           str(failing[0][0]) if failing else None)
