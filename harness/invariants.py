"""An outside auditor of a runner store and its synthetic target (issue 8).

It reads both SQLite files directly with ``sqlite3`` and trusts none of runner's code, so
a bug in runner cannot hide itself from it.  The invariants, checked after every run of
the chaos runner, the kill -9 accounting, the countdown and the model-based test:

1. no key has more than one target row (counting rows the CRM has since deleted, kept in
   ``sheet_deleted`` by the harness that deleted them);
2. every accepted (acknowledged) record is present in the store;
3. every record is in a legal state, ``in_flight`` only while a crash is unrecovered;
4. every record whose target row exists is confirmed, uncertain or
   confirmed_then_missing (or in flight, while a crash is unrecovered);
5. ``PRAGMA integrity_check`` is ``ok`` on the store (and on the target).

and for candidates (SPEC C): every status is legal, every ``candidate_changed`` event
follows the lifecycle's transition table from the candidate's previous status, and the
last event agrees with the row; and, because they are cheap and catch the same bugs
earlier: no target row for a key that
was never accepted; a confirmed record has exactly one row with its write_id; a prepared
record has no attempts and no row; the outbox is gap-free and every ``state_changed``
event follows the transition table from the record's previous state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.candidates.states import TRANSITIONS as CANDIDATE_TRANSITIONS
from runner.candidates.states import CandidateStatus
from runner.leads.states import TRANSITIONS, LeadState

ROW_STATES = {LeadState.CONFIRMED, LeadState.UNCERTAIN, LeadState.CONFIRMED_THEN_MISSING}
DELETED_TABLE = "sheet_deleted"


@dataclass
class Audit:
    violations: list[str] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)
    keys: set[str] = field(default_factory=set)
    rows: Counter[str] = field(default_factory=Counter)
    #: records that went uncertain -> confirmed (a readback recovered them)
    recovered: set[str] = field(default_factory=set)
    candidates: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, text: str) -> None:
        self.violations.append(text)


def _connect(path: Path) -> sqlite3.Connection:
    """Read-only, unless the file's WAL was left by a writer killed mid-transaction: its
    index must then be rebuilt (SQLite's recovery), which needs write access to it and
    changes no row, so the file is opened read-write for that."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        if "readonly" not in str(exc):
            raise
        return sqlite3.connect(str(path), timeout=30)
    return conn


def target_rows(target: Path) -> list[tuple[str, str]]:
    """(source_lead_id, write_id) of every row the target holds or has held."""
    if not target.exists():
        return []
    conn = _connect(target)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        out: list[tuple[str, str]] = []
        for table in ("sheet", DELETED_TABLE):
            if table in tables:
                out += conn.execute(f"SELECT source_lead_id, write_id FROM {table}").fetchall()
        return out
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = _connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


QUERIES = {
    "records": "SELECT source_lead_id, write_id, state, attempts FROM {t}leads",
    "outbox": "SELECT seq, kind, subject, payload::text FROM {t}outbox ORDER BY seq",
    "candidates": "SELECT id, status, decision_id FROM {t}candidates",
    "candidate_events": "SELECT subject, payload::text FROM {t}outbox "
                        "WHERE kind = 'candidate_changed' ORDER BY seq",
    # a pruned store (schema v7, ``runner outbox prune``) starts after its floor
    "floor": "SELECT floor FROM {t}outbox_retention",
}


Rows = list[tuple[Any, ...]]


def is_postgres(db: Path | str) -> bool:
    return str(db).startswith(("postgresql://", "postgres://"))


def read_store(db: Path | str) -> dict[str, Rows | None]:
    """The rows the checks need, read with the store's own driver."""
    return fetch(db, QUERIES)


def query(db: Path | str, sql: str, *params: Any) -> Rows:
    """One query on either backend (``{t}`` before a table name; ``?`` placeholders)."""
    return fetch(db, {"q": sql}, params)["q"] or []


def fetch(db: Path | str, queries: dict[str, str], params: tuple[Any, ...] = (),
          ) -> dict[str, Rows | None]:
    """Run read queries with the store's own driver (sqlite3 for a file, asyncpg for a
    ``postgresql://`` location); None for a query on a table the store does not have."""
    if is_postgres(db):
        return _fetch_postgres(str(db), queries, params)
    out: dict[str, Rows | None] = dict.fromkeys(queries)
    if not Path(db).exists():
        return out
    conn = _connect(Path(db))
    try:
        for name, sql in queries.items():
            # a missing table: a store from before it, or whose creation never committed
            with contextlib.suppress(sqlite3.OperationalError):
                out[name] = conn.execute(sql.format(t="").replace("::text", ""),
                                         params).fetchall()
    finally:
        conn.close()
    return out


def _fetch_postgres(location: str, queries: dict[str, str], params: tuple[Any, ...],
                    ) -> dict[str, Rows | None]:
    import asyncio

    import asyncpg

    from runner.io.postgres.dsn import parse

    where = parse(location)

    async def go() -> dict[str, Rows | None]:
        out: dict[str, Rows | None] = dict.fromkeys(queries)
        conn = await asyncpg.connect(where.dsn, timeout=30)
        try:
            for name, sql in queries.items():
                numbered = sql.format(t=where.schema_ident + ".")
                for n in range(1, len(params) + 1):
                    numbered = numbered.replace("?", f"${n}", 1)
                try:
                    rows = await conn.fetch(numbered, *params)
                except asyncpg.exceptions.UndefinedTableError:
                    continue
                out[name] = [tuple(r) for r in rows]
        finally:
            await conn.close()
        return out

    # on a loop of its own in a helper thread: callers may be inside an event loop
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def audit(
    db: Path | str,
    target: Path,
    *,
    accepted: Iterable[str] = (),
    in_flight_ok: bool = False,
    dedupes: bool = False,
    rows: list[tuple[str, str]] | None = None,
) -> Audit:
    """Check every invariant; ``accepted`` are the keys whose accept was acknowledged.
    ``db`` is a SQLite file or a ``postgresql://`` location (integrity_check is SQLite's;
    PostgreSQL checks its own pages).  ``dedupes``: the target deduplicates by write_id
    (SPEC E7), so a record queued to be sent again may meet its own row, which arrived
    after the readback that found none.  ``rows``: the target's ``(source_lead_id,
    write_id)`` rows when it is not a SQLite sheet at ``target`` (a PostgreSQL table)."""
    result = Audit()
    if not is_postgres(db):
        db = Path(db)
    rows = target_rows(target) if rows is None else rows
    result.rows = Counter(key for key, _ in rows)
    row_ids: dict[str, set[str]] = {}
    for key, write_id in rows:
        row_ids.setdefault(key, set()).add(write_id)
    for key, n in result.rows.items():
        if n > 1:
            result.fail(f"duplicated: {key} has {n} target rows")
    data = read_store(db)
    if isinstance(db, Path) and db.exists() and (check := integrity(db)) != "ok":
        result.fail(f"store integrity_check: {check}")
    if target.exists() and (check := integrity(target)) != "ok":
        result.fail(f"target integrity_check: {check}")
    _check_records(data["records"] or [], result, row_ids, in_flight_ok, dedupes)
    floor = int(data["floor"][0][0]) if data["floor"] else 0
    _check_outbox(data["outbox"] or [], result, floor)
    if not floor:  # a prune removed the first events of some candidates
        _check_candidates(data["candidates"], data["candidate_events"] or [], result)
    for key in accepted:
        if key not in result.keys:
            result.fail(f"lost: {key} was acknowledged but is not in the store")
    for key in result.rows:
        if key not in result.keys:
            result.fail(f"unexpected: a target row for {key}, never accepted")
    return result


def _check_records(records: list[tuple[Any, ...]], result: Audit,
                   row_ids: dict[str, set[str]], in_flight_ok: bool,
                   dedupes: bool = False) -> None:
    allowed = ROW_STATES | {LeadState.FAILED_SAFE} if dedupes else ROW_STATES
    for key, write_id, state, attempts in records:
        result.keys.add(key)
        result.states[state] += 1
        try:
            st = LeadState(state)
        except ValueError:
            result.fail(f"illegal state: {key} is {state!r}")
            continue
        if st is LeadState.IN_FLIGHT and not in_flight_ok:
            result.fail(f"in_flight after recovery: {key}")
        has_row = key in row_ids
        if has_row and st not in allowed and st is not LeadState.IN_FLIGHT:
            result.fail(f"{key} has a target row but is {state}")
        if has_row and write_id not in row_ids[key]:
            result.fail(f"{key}: target row carries another write_id")
        if st is LeadState.CONFIRMED and not has_row:
            result.fail(f"{key} is confirmed without a target row")
        if st is LeadState.PREPARED and (attempts != 0 or has_row):
            result.fail(f"{key} is prepared but has attempts={attempts} or a row")


def _check_outbox(events: list[tuple[Any, ...]], result: Audit, floor: int = 0) -> None:
    """Gap-free from ``floor + 1`` (every event up to the floor was pruned); a record whose
    earlier events were pruned is checked from its first event still there."""
    last: dict[str, LeadState] = {}
    for expected, (seq, kind, subject, payload) in enumerate(events, start=floor + 1):
        if seq != expected:
            result.fail(f"outbox gap: seq {seq} where {expected} was expected")
            break
        if kind == "accepted":
            last[subject] = LeadState.PREPARED
        elif kind == "state_changed":
            doc = json.loads(payload)
            src, dst = LeadState(doc["from"]), LeadState(doc["to"])
            if floor and subject not in last:
                last[subject] = src  # its earlier events were pruned
            if last.get(subject) is not src:
                result.fail(f"outbox: {subject} moved from {src} but was {last.get(subject)}")
            if dst not in TRANSITIONS[src]:
                result.fail(f"outbox: illegal transition {src} -> {dst} for {subject}")
            if src is LeadState.UNCERTAIN and dst is LeadState.CONFIRMED:
                result.recovered.add(subject)
            last[subject] = dst


def _check_candidates(rows: list[tuple[Any, ...]] | None, events: list[tuple[Any, ...]],
                      result: Audit) -> None:
    if rows is None:
        return  # a store from before the lifecycle
    last: dict[str, CandidateStatus | None] = {}
    for subject, payload in events:
        doc = json.loads(payload)
        src = CandidateStatus(doc["from"]) if doc["from"] is not None else None
        dst = CandidateStatus(doc["to"])
        if last.get(subject) != src:
            result.fail(f"candidate {subject} moved from {src} but was {last.get(subject)}")
        if src is not None and src != dst and dst not in CANDIDATE_TRANSITIONS[src]:
            result.fail(f"candidate {subject}: illegal transition {src} -> {dst}")
        last[subject] = dst
    for cid, status, decision in rows:
        result.candidates[status] += 1
        if status not in set(CandidateStatus):
            result.fail(f"candidate {cid} is in an illegal status {status!r}")
        elif last.get(cid) != CandidateStatus(status):
            result.fail(f"candidate {cid} is {status} but its events say {last.get(cid)}")
        if status == CandidateStatus.PROMOTED and decision is None:
            result.fail(f"candidate {cid} is promoted without a decision")
