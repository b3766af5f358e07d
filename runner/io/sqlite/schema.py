"""SQLite schema and versioned migrations (SPEC K2, K3, K9).

The schema version lives in ``PRAGMA user_version`` and the file is marked as a runner
store by ``PRAGMA application_id``.  Migrations run inside the caller's ``BEGIN
IMMEDIATE`` transaction, together with the scope pin, so creating a store is one
transaction and two processes creating it at once end with one store.

Invariants are enforced by the schema itself, not only by the code that writes it:

* the outbox is append-only (UPDATE raises; DELETE raises above the recorded prune
  floor, v7);
* pipeline records, work rows and histories lose rows only as ``pipeline prune`` allows
  (v10, ``runner.io.sqlite.pipeline_schema.PIPELINE_V10``);
* lead records are never deleted and their key, content and ``write_id`` never change;
* a state change outside ``runner.leads.states.TRANSITIONS`` raises;
* every insert and every state change writes its outbox event in the same statement's
  transaction, by trigger, so no code path can forget it.
"""

from __future__ import annotations

from runner.io.sqlite.candidates_schema import CANDIDATES_V1
from runner.io.sqlite.figures_schema import V8 as FIGURES_V8
from runner.io.sqlite.figures_schema import V14 as FIGURES_V14
from runner.io.sqlite.marks_schema import V18
from runner.io.sqlite.pipeline_schema import PIPELINE_V1, PIPELINE_V10, PIPELINE_V15
from runner.io.sqlite.resend_schema import V17
from runner.leads.states import LeadState

APPLICATION_ID = 0x52554E52  # "RUNR"


#: ``runner.pipeline.stages.raw_ingestion.CURSOR`` (not imported: opening a store stays
#: light; tests/test_retention.py keeps the two equal)
RETRIEVER_CURSOR = "raw-retriever:outbox"


def _state_list() -> str:
    return ", ".join(f"'{state.value}'" for state in LeadState)


def transition_list(pairs: list[tuple[LeadState, LeadState]]) -> str:
    """The SQL list of allowed ``'from>to'`` pairs."""
    return ", ".join(f"'{src.value}>{dst.value}'" for src, dst in pairs)


def transition_tokens(pairs: list[tuple[LeadState, LeadState]]) -> str:
    """The allowed pairs as one SQL string ``'|from>to|from>to|'``: ``'|' || OLD.state ||
    '>' || NEW.state || '|'`` is in it (``instr``) exactly when the pair is allowed, as no
    state holds ``|`` (the column's CHECK lists them)."""
    return "'|" + "|".join(f"{src.value}>{dst.value}" for src, dst in pairs) + "|'"


S = LeadState
#: the lead transitions the v1 guard allows.  Frozen here, not read from
#: ``runner.leads.states``: a migration's text never changes once released (v9 replaces the
#: guard with ``V9_TRANSITIONS``)
V1_TRANSITIONS = [
    (S.PREPARED, S.IN_FLIGHT), (S.IN_FLIGHT, S.CONFIRMED), (S.IN_FLIGHT, S.FAILED_SAFE),
    (S.IN_FLIGHT, S.UNCERTAIN), (S.CONFIRMED, S.CONFIRMED_THEN_MISSING),
    (S.FAILED_SAFE, S.IN_FLIGHT), (S.UNCERTAIN, S.CONFIRMED),
]
#: from v9 on: ``uncertain -> failed_safe`` by an operator's recorded decision (a test
#: checks that this is exactly ``runner.leads.states.allowed_pairs()``)
V9_TRANSITIONS = [*V1_TRANSITIONS, (S.UNCERTAIN, S.FAILED_SAFE)]


V1 = f"""
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE leads (
    seq                INTEGER PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    source_lead_id     TEXT NOT NULL,
    canonical          TEXT NOT NULL,
    write_id           TEXT NOT NULL UNIQUE,
    state              TEXT NOT NULL DEFAULT 'prepared' CHECK (state IN ({_state_list()})),
    attempts           INTEGER NOT NULL DEFAULT 0,
    reconcile_attempts INTEGER NOT NULL DEFAULT 0,
    snapshot           TEXT,
    last_polled_at     TEXT,
    accepted_at        TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    UNIQUE (tenant_id, source_lead_id)
) STRICT;

CREATE INDEX leads_by_state ON leads (state, seq);

CREATE TABLE outbox (
    seq     INTEGER PRIMARY KEY,
    kind    TEXT NOT NULL,
    subject TEXT,
    payload TEXT NOT NULL,
    at      TEXT NOT NULL
) STRICT;

CREATE TRIGGER outbox_no_update BEFORE UPDATE ON outbox
BEGIN SELECT RAISE(ABORT, 'outbox is append-only'); END;

CREATE TRIGGER outbox_no_delete BEFORE DELETE ON outbox
BEGIN SELECT RAISE(ABORT, 'outbox is append-only'); END;

CREATE TRIGGER leads_no_delete BEFORE DELETE ON leads
BEGIN SELECT RAISE(ABORT, 'lead records are never deleted'); END;

CREATE TRIGGER leads_identity_fixed
BEFORE UPDATE OF tenant_id, source_lead_id, canonical, write_id, accepted_at ON leads
WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.source_lead_id IS NOT OLD.source_lead_id
  OR NEW.canonical IS NOT OLD.canonical OR NEW.write_id IS NOT OLD.write_id
  OR NEW.accepted_at IS NOT OLD.accepted_at
BEGIN SELECT RAISE(ABORT, 'a lead record''s key, content and write_id never change'); END;

CREATE TRIGGER leads_transition_guard BEFORE UPDATE OF state ON leads
WHEN NEW.state IS NOT OLD.state
 AND OLD.state || '>' || NEW.state NOT IN ({transition_list(V1_TRANSITIONS)})
BEGIN SELECT RAISE(ABORT, 'illegal lead transition'); END;

CREATE TRIGGER leads_accepted AFTER INSERT ON leads
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('accepted', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'state', NEW.state),
            NEW.accepted_at);
END;

CREATE TRIGGER leads_state_changed AFTER UPDATE OF state ON leads
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('state_changed', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'from', OLD.state, 'to', NEW.state,
                        'attempts', NEW.attempts,
                        'reconcile_attempts', NEW.reconcile_attempts),
            NEW.updated_at);
END;
"""

#: v2, delivery: the last abnormal reconcile verdict of a record, and one
#: ``target_ambiguous`` event each time it changes to a new non-empty value (two rows
#: for one write_id, or a row whose fields differ from the mapped record)
V2 = """
ALTER TABLE leads ADD COLUMN reconcile_note TEXT;

CREATE TRIGGER leads_target_ambiguous AFTER UPDATE OF reconcile_note ON leads
WHEN NEW.reconcile_note IS NOT NULL AND NEW.reconcile_note IS NOT OLD.reconcile_note
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('target_ambiguous', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'reason', NEW.reconcile_note,
                        'reconcile_attempts', NEW.reconcile_attempts),
            NEW.updated_at);
END;
"""

#: v3, status polling (L11, L12): when the snapshot last changed, one ``status_changed``
#: event per changed snapshot (by trigger, so an unchanged poll can never write one), the
#: poll order index, and poll-health runs (one ``poll_health`` event per run of the same
#: failure, deduplicated here so separate processes share it)
V3 = """
ALTER TABLE leads ADD COLUMN snapshot_changed_at TEXT;

CREATE INDEX leads_poll_order ON leads (state, last_polled_at, seq);

CREATE TRIGGER leads_status_changed AFTER UPDATE OF snapshot ON leads
WHEN NEW.snapshot IS NOT OLD.snapshot
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('status_changed', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'snapshot', json(NEW.snapshot), 'previous', json(OLD.snapshot)),
            NEW.updated_at);
END;

CREATE TABLE poll_health (
    run          INTEGER PRIMARY KEY,
    failure      TEXT NOT NULL,
    first_at     TEXT NOT NULL,
    last_at      TEXT NOT NULL,
    passes       INTEGER NOT NULL DEFAULT 1,
    recovered_at TEXT
) STRICT;

CREATE TRIGGER poll_health_no_delete BEFORE DELETE ON poll_health
BEGIN SELECT RAISE(ABORT, 'poll health runs are kept'); END;

CREATE TRIGGER poll_health_event AFTER INSERT ON poll_health
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('poll_health', NULL,
            json_object('run', NEW.run, 'failure', NEW.failure, 'state', 'failing'),
            NEW.first_at);
END;
"""

#: v6, the pinned target (L9, issue 15): the identity of the target this store delivers
#: to, pinned like the scope by the first delivery run and never changed after (the
#: triggers refuse it); at most one row.  A store made before v6 has none until its first
#: delivery run pins one (``runner.tasks.target`` says when that is safe).
V6 = """
CREATE TABLE target_pin (
    only_row  INTEGER PRIMARY KEY CHECK (only_row = 1),
    target_id TEXT NOT NULL CHECK (length(target_id) > 0),
    pinned_at TEXT NOT NULL
) STRICT;

CREATE TRIGGER target_pin_no_update BEFORE UPDATE ON target_pin
BEGIN SELECT RAISE(ABORT, 'the pinned target never changes'); END;

CREATE TRIGGER target_pin_no_delete BEFORE DELETE ON target_pin
BEGIN SELECT RAISE(ABORT, 'the pinned target never changes'); END;
"""

#: v7, outbox retention (K3, E6, issue 15; ``runner.retention``): the outbox stays
#: append-only above a recorded prune floor and may lose events only below it.  The
#: floor only moves up and never past the export watermark (once one is recorded), the
#: raw retriever's cursor or the newest event; the watermark only moves forward; every
#: prune is recorded in ``outbox_prunes``, which never changes.
V7 = f"""
CREATE TABLE outbox_retention (
    only_row         INTEGER PRIMARY KEY CHECK (only_row = 1),
    floor            INTEGER NOT NULL DEFAULT 0 CHECK (floor >= 0),
    export_watermark INTEGER CHECK (export_watermark >= 0),
    updated_at       TEXT
) STRICT;
INSERT INTO outbox_retention (only_row, floor) VALUES (1, 0);

CREATE TABLE outbox_prunes (
    id         INTEGER PRIMARY KEY,
    from_floor INTEGER NOT NULL,
    to_floor   INTEGER NOT NULL,
    removed    INTEGER NOT NULL,
    by_kind    TEXT NOT NULL,
    limited_by TEXT NOT NULL,
    at         TEXT NOT NULL
) STRICT;

CREATE TRIGGER outbox_prunes_fixed BEFORE UPDATE ON outbox_prunes
BEGIN SELECT RAISE(ABORT, 'the prune record never changes'); END;
CREATE TRIGGER outbox_prunes_kept BEFORE DELETE ON outbox_prunes
BEGIN SELECT RAISE(ABORT, 'the prune record never changes'); END;
CREATE TRIGGER outbox_retention_kept BEFORE DELETE ON outbox_retention
BEGIN SELECT RAISE(ABORT, 'the retention row is kept'); END;

CREATE TRIGGER outbox_retention_guard BEFORE UPDATE ON outbox_retention
BEGIN
    SELECT RAISE(ABORT, 'the prune floor only moves up') WHERE NEW.floor < OLD.floor;
    SELECT RAISE(ABORT, 'the export watermark only moves forward')
    WHERE OLD.export_watermark IS NOT NULL
      AND (NEW.export_watermark IS NULL OR NEW.export_watermark < OLD.export_watermark);
    SELECT RAISE(ABORT, 'the export watermark is past the newest event')
    WHERE NEW.export_watermark > (SELECT coalesce(max(seq), 0) FROM outbox);
    SELECT RAISE(ABORT, 'never prune what has not been exported')
    WHERE NEW.floor > OLD.floor AND NEW.export_watermark IS NOT NULL
      AND NEW.floor > NEW.export_watermark;
    SELECT RAISE(ABORT, 'never prune what the raw retriever has not read')
    WHERE NEW.floor > OLD.floor
      AND NEW.floor > coalesce((SELECT position FROM pipeline_cursors
                                WHERE name = '{RETRIEVER_CURSOR}'), 0);
    SELECT RAISE(ABORT, 'the newest event is always kept')
    WHERE NEW.floor > OLD.floor AND NEW.floor >= (SELECT coalesce(max(seq), 0) FROM outbox);
END;

DROP TRIGGER outbox_no_delete;
CREATE TRIGGER outbox_no_delete BEFORE DELETE ON outbox
WHEN OLD.seq > (SELECT floor FROM outbox_retention)
BEGIN SELECT RAISE(ABORT, 'outbox is append-only above its prune floor'); END;
"""

#: v9, operators (E5, issue 19): what ``runner uncertain`` lists and what ``runner
#: resolve`` records.
#:
#: * ``uncertain_since``: when the record last became uncertain (set by trigger on every
#:   move into uncertain; a record already uncertain gets its last change time);
#:   ``last_reconcile`` / ``last_reconcile_at``: the verdict of its latest readback in
#:   this episode (``none``, ``ambiguous``, ``mismatch``, ``read_failed``), cleared when
#:   it becomes uncertain again.
#: * ``operator_decisions``: every decision an operator recorded, kept as written (UPDATE
#:   and DELETE raise), each with one ``operator_resolved`` outbox event carrying the
#:   operator's reason.
#: * the guard allows ``uncertain -> failed_safe``, and a second trigger refuses it unless
#:   a ``not_sent`` decision for that record at its current ``attempts`` exists: one
#:   decision authorises one resend of one uncertain episode (a send adds an attempt),
#:   and nothing else in the store can make an uncertain record sendable.
V9 = f"""
ALTER TABLE leads ADD COLUMN uncertain_since TEXT;
ALTER TABLE leads ADD COLUMN last_reconcile TEXT;
ALTER TABLE leads ADD COLUMN last_reconcile_at TEXT;

UPDATE leads SET uncertain_since = updated_at WHERE state = 'uncertain';

CREATE TRIGGER leads_uncertain_since AFTER UPDATE OF state ON leads
WHEN NEW.state = 'uncertain' AND OLD.state IS NOT 'uncertain'
BEGIN
    UPDATE leads SET uncertain_since = NEW.updated_at, last_reconcile = NULL,
                     last_reconcile_at = NULL
    WHERE seq = NEW.seq;
END;

CREATE TABLE operator_decisions (
    id             INTEGER PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    source_lead_id TEXT NOT NULL,
    write_id       TEXT NOT NULL,
    decision       TEXT NOT NULL CHECK (decision IN ('confirmed', 'not_sent')),
    reason         TEXT NOT NULL CHECK (length(trim(reason)) > 0),
    readback       TEXT,
    attempts       INTEGER NOT NULL,
    decided_at     TEXT NOT NULL
) STRICT;

CREATE INDEX operator_decisions_by_record ON operator_decisions (write_id, attempts);

CREATE TRIGGER operator_decisions_no_update BEFORE UPDATE ON operator_decisions
BEGIN SELECT RAISE(ABORT, 'operator decisions are kept as recorded'); END;

CREATE TRIGGER operator_decisions_no_delete BEFORE DELETE ON operator_decisions
BEGIN SELECT RAISE(ABORT, 'operator decisions are kept as recorded'); END;

CREATE TRIGGER operator_resolved AFTER INSERT ON operator_decisions
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('operator_resolved', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'decision', NEW.decision, 'reason', NEW.reason,
                        'readback', NEW.readback, 'attempts', NEW.attempts),
            NEW.decided_at);
END;

DROP TRIGGER leads_transition_guard;

CREATE TRIGGER leads_transition_guard BEFORE UPDATE OF state ON leads
WHEN NEW.state IS NOT OLD.state
 AND OLD.state || '>' || NEW.state NOT IN ({transition_list(V9_TRANSITIONS)})
BEGIN SELECT RAISE(ABORT, 'illegal lead transition'); END;

CREATE TRIGGER leads_resend_needs_decision BEFORE UPDATE OF state ON leads
WHEN OLD.state = 'uncertain' AND NEW.state = 'failed_safe'
 AND NOT EXISTS (SELECT 1 FROM operator_decisions d
                 WHERE d.write_id = NEW.write_id AND d.decision = 'not_sent'
                   AND d.attempts = OLD.attempts)
BEGIN
    SELECT RAISE(ABORT,
        'illegal lead transition: uncertain -> failed_safe needs a recorded not-sent decision');
END;
"""

#: v11: PostgreSQL numbers a statement's outbox events set-wise (its schema module);
#: SQLite's row triggers already cost little, so nothing changes here but the version,
#: which means the same on both backends
V11 = "SELECT 1;"

#: v12, pacing and backoff (issue 16, E2): ``next_attempt_at``, when a ``failed_safe``
#: record is due again (NULL: now; set with the failed_safe outcome, cleared by every
#: other state change), so a restart keeps the backoff schedule; dispatch skips a record
#: not due, so a retry that has not happened writes no outbox event.  A partial index of
#: the records waiting (status: how many, the earliest).  (The reconcile order, oldest
#: attempt first, is sorted from ``leads_by_state``: SQLite's planner prefers it to a
#: partial index, and the sort of the uncertain records' keys is cheap.)
V12 = """
ALTER TABLE leads ADD COLUMN next_attempt_at TEXT;
CREATE INDEX leads_retry_waiting ON leads (next_attempt_at) WHERE state = 'failed_safe';
"""

#: v13, the reason of a rejected write (issue 17): ``last_error``, the target's own reason
#: for refusing the request that made the record ``failed_safe`` (HTTP 400/422:
#: ``RejectedWrite``), bounded (``MAX_LAST_ERROR``), set with the failed_safe outcome and
#: cleared by every other state change, as ``next_attempt_at``.  The server's words, never
#: the record's data.  A partial index: status counts the failed_safe records with one.
V13 = """
ALTER TABLE leads ADD COLUMN last_error TEXT;
CREATE INDEX leads_failed_with_reason ON leads (seq)
WHERE state = 'failed_safe' AND last_error IS NOT NULL;
"""

#: v16, the same transition guard as v9 without an ``IN`` list (issue 17, HTTP dispatch
#: speed).  A trigger runs as a sub-program per row, and SQLite builds the ephemeral index
#: of an ``IN (...)`` list again at each run: in a batch step (one statement, 200 rows)
#: that was about a quarter of the statement's instructions (valgrind), and a batched
#: dispatch's commit is most of a batch's time.  The same pairs, looked up by ``instr`` in
#: one delimited string (``transition_tokens``); a test walks every pair of states.
#: On PostgreSQL, v16 gives the guard's trigger a WHEN condition, so that its PL/pgSQL
#: function is called only when a change needs it.
V16 = f"""
DROP TRIGGER leads_transition_guard;

CREATE TRIGGER leads_transition_guard BEFORE UPDATE OF state ON leads
WHEN NEW.state IS NOT OLD.state
 AND instr({transition_tokens(V9_TRANSITIONS)}, '|' || OLD.state || '>' || NEW.state || '|') = 0
BEGIN SELECT RAISE(ABORT, 'illegal lead transition'); END;
"""

#: v19, a leaner dispatch (issue 32): the poll order index holds the confirmed records
#: only (the poll pass reads no others), so the records a dispatch moves by the thousand
#: (prepared -> in_flight -> confirmed) no longer pay its upkeep at every step: in a
#: batch's statement (1,000 + 1,000 rows), about a tenth of the time per row.  The same
#: on PostgreSQL.
V19 = """
DROP INDEX leads_poll_order;
CREATE INDEX leads_poll_order ON leads (last_polled_at, seq) WHERE state = 'confirmed';
"""

#: v20: PostgreSQL's lock order for a batch's outcomes beside its next mark (its v20);
#: SQLite has one writer at a time, so nothing changes here.
V20 = ""

#: version -> the DDL that brings version-1 to version.  Append, never edit.
MIGRATIONS: dict[int, str] = {1: V1, 2: V2, 3: V3, 4: CANDIDATES_V1, 5: PIPELINE_V1, 6: V6,
                              7: V7, 8: FIGURES_V8, 9: V9, 10: PIPELINE_V10,
                              11: V11, 12: V12, 13: V13, 14: FIGURES_V14,
                              15: PIPELINE_V15, 16: V16, 17: V17, 18: V18,
                              19: V19, 20: V20}
LATEST = max(MIGRATIONS)


def pending(current: int) -> list[tuple[int, str]]:
    """The migrations to apply to a store at ``current``, in order."""
    return [(v, MIGRATIONS[v]) for v in sorted(MIGRATIONS) if v > current]
