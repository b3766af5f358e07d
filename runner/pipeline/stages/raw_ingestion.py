"""Raw ingestion (SPEC P1, P6, P11): the lead outbox -> D1 raw inputs.

The source is the store's own outbox, read by sequence.  Each lead event (kinds
``accepted``, ``state_changed``, ``status_changed`` by default) becomes one D1 record
under the natural key ``outbox:<seq>``; a record that exists is left as it is, so reading
a range twice (a lost cursor, a backfill, two retrievers) never writes a second copy.  The
cursor moves forward in the same transaction as the records: it saves re-reading, it is
never the proof that an event was ingested (the D1 record is).

The cursor only moves forward, past events of kinds the retriever did not tail at the
time (a hot configuration may leave a kind out, then take it back).  Those events stay in
the backlog (it is counted from the records), and the worker closes such gaps itself
(:class:`Gaps`): when it starts, and whenever the tailed kinds change, it looks for the
first pending event behind the cursor and re-reads from there up to the cursor, a batch
per cycle, before it goes on with the tail.

A D1 record keeps only what the pipeline uses, named by key: the event's sequence, kind,
time, the lead's key and tenant, its form, and per kind the delivery states or the
observed business ``status``.  Never a contact field, never a whole snapshot.

Ingesting a raw input writes no outbox event (pipeline bookkeeping never does), so the
retriever never feeds on its own writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from runner.pipeline.model import Stage

if TYPE_CHECKING:  # imported where they run: ``status`` needs only the names below
    from runner.clock import Clock
    from runner.pipeline.engine import RoundResult
    from runner.pipeline.model import NewRecord, OutboxEvent
    from runner.pipeline.port import PipelineStore

STAGE = Stage.RAW_INGESTION
WORKER = "raw-retriever"
JOB = "backfill"
#: the retriever's identity and version (the provenance of D1 records)
SOURCE = ("lead-outbox", 1)
SOURCE_LABEL = f"{SOURCE[0]}@{SOURCE[1]}"
CURSOR = "raw-retriever:outbox"
LEAD_KINDS: tuple[str, ...] = ("accepted", "state_changed", "status_changed")


class IngestSettings(NamedTuple):
    """How the raw retriever reads the outbox: events per batch, and the kinds it keeps."""

    batch_size: int = 100
    kinds: tuple[str, ...] = LEAD_KINDS


def _kept(kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "accepted":
        return {"state": data.get("state")}
    if kind == "state_changed":
        return {"from": data.get("from"), "to": data.get("to")}
    if kind == "status_changed":
        snapshot = data.get("snapshot")
        snap = snapshot if isinstance(snapshot, Mapping) else {}
        status = snap.get("status")
        return {"status": status if isinstance(status, str) else None,
                "missing": snap.get("missing") is True}
    return {}


def to_record(event: OutboxEvent) -> NewRecord:
    """The D1 record of an outbox event (privacy: only the fields listed here)."""
    from runner.pipeline.model import NewRecord

    tenant = event.payload.get("tenant_id")
    return NewRecord(f"outbox:{event.seq}", {
        "seq": event.seq,
        "kind": event.kind,
        "lead": event.subject,
        "tenant_id": tenant if isinstance(tenant, str) else None,
        "form_id": event.form_id,
        "at": event.at,
        "data": _kept(event.kind, event.payload),
    })


async def ingest_events(store: PipelineStore, events: Sequence[OutboxEvent],
                        kinds: Sequence[str], clock: Clock, *, cursor: str | None
                        ) -> RoundResult:
    from runner.pipeline.engine import RoundResult, now_ms

    wanted = [to_record(e) for e in events if e.kind in kinds]
    position = events[-1].seq if events else None
    new = await store.ingest(wanted, SOURCE, cursor, position, now_ms(clock))
    return RoundResult(claimed=len(events), outcomes={
        "ingested": new, "already_there": len(wanted) - new,
        "skipped": len(events) - len(wanted)})


@dataclass
class Gaps:
    """What one retriever knows of the events behind its cursor that it skipped."""

    #: the kinds the last look behind the cursor was for (None: not looked yet)
    checked: tuple[str, ...] | None = None
    #: re-read the outbox after this sequence, up to the cursor (None: no gap left)
    after: int | None = None


async def run_cycle(store: PipelineStore, settings: IngestSettings, clock: Clock,
                    gaps: Gaps | None = None) -> RoundResult:
    """One batch: of a gap behind the cursor while ``gaps`` has one, else of the tail
    (events after the cursor, ingested, cursor moved)."""
    from runner.pipeline.engine import RoundResult

    after = await store.cursor_position(CURSOR)
    if gaps is not None:
        if gaps.checked != settings.kinds:
            gaps.checked = settings.kinds
            first = await store.outbox_first_pending(0, settings.kinds)
            gaps.after = first - 1 if first is not None and first <= after else None
        if gaps.after is not None:
            behind = await store.read_outbox(gaps.after, settings.batch_size, after)
            gaps.after = behind[-1].seq if behind and behind[-1].seq < after else None
            if behind:
                return await ingest_events(store, behind, settings.kinds, clock, cursor=None)
    events = await store.read_outbox(after, settings.batch_size)
    if not events:
        return RoundResult()
    return await ingest_events(store, events, settings.kinds, clock, cursor=CURSOR)


async def backfill(store: PipelineStore, settings: IngestSettings, clock: Clock, *,
                   from_seq: int, to_seq: int,
                   on_batch: Callable[[RoundResult, int], None]) -> RoundResult:
    """Re-read the outbox range ``(from_seq, to_seq]`` into D1 (what exists stays as it
    is).  A range that starts at or before the retriever's cursor moves it forward past
    what it read; one that starts after it leaves it alone (it would skip the gap).
    ``on_batch(result, last_seq)`` after each batch."""
    from runner.pipeline.engine import RoundResult

    total = RoundResult()
    after = from_seq
    cursor = CURSOR if from_seq <= await store.cursor_position(CURSOR) else None
    while after < to_seq:
        events = await store.read_outbox(after, settings.batch_size, to_seq)
        if not events:
            break
        result = await ingest_events(store, events, settings.kinds, clock, cursor=cursor)
        total.add(result)
        after = events[-1].seq
        on_batch(result, after)
    return total


async def pending(store: PipelineStore, kinds: Sequence[str]) -> int:
    """The raw ingestion backlog: events of the tailed kinds not in D1 (an event skipped
    while its kind was not tailed stays pending until the worker's gap check, or a
    backfill, reads it).  From kept counts: a few small reads, not a scan of the outbox."""
    return await store.raw_pending(kinds)
