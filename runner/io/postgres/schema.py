"""PostgreSQL schema and versioned migrations (SPEC K2, K3, K9).

Everything lives in one PostgreSQL schema of its own (``runner`` unless the DSN says
``?schema=…``); every name is qualified with it, in the DDL and in the trigger bodies, so
no session's ``search_path`` can send a write elsewhere.  Applied versions are rows of
``schema_migrations``; the version numbers are the SQLite adapter's, so a store's
``schema_version`` means the same thing on both backends.

The database enforces the invariants itself, as the SQLite triggers do:

* the outbox is append-only: UPDATE and TRUNCATE raise, and DELETE raises above the
  recorded prune floor (v7, ``runner.retention``; its DDL and v11's are in
  ``outbox_schema.py``);
* lead records are never deleted (DELETE and TRUNCATE raise) and their key, content and
  ``write_id`` never change;
* a state change outside ``runner.leads.states.TRANSITIONS`` raises (the list in the trigger is
  generated from that table);
* every insert and every state change writes its outbox event from a trigger, in the same
  transaction, so no code path can forget it.

Times are fixed-width UTC text (``runner.clock.to_text``) compared byte-wise
(``COLLATE "C"``): text order is time order whatever the database's collation.

Why a counter row and not a SEQUENCE for the outbox: ``nextval`` is not transactional, so
a rolled-back transaction leaves a hole, and two concurrent transactions can commit their
numbers out of order (a reader tailing the outbox would skip the lower one for good).
``outbox_append`` instead increments the single row of ``outbox_counter`` in the writing
transaction: the row lock it takes serialises outbox writers until commit, so numbers are
handed out in commit order, a rollback gives its number back, and the sequence has no
gaps.  The price is that writers queue on that row for the (short) rest of their
transaction; every runner write is one statement, so the queue is short.
"""

from __future__ import annotations

from runner.io.postgres.candidates_schema import CANDIDATES_V1
from runner.io.postgres.ddl import refuse
from runner.io.postgres.figures_schema import V8 as FIGURES_V8
from runner.io.postgres.figures_schema import V14 as FIGURES_V14
from runner.io.postgres.marks_schema import V18
from runner.io.postgres.outbox_schema import V7, V11, V20
from runner.io.postgres.pipeline_schema import PIPELINE_V1, PIPELINE_V10, PIPELINE_V15
from runner.io.postgres.resend_schema import V17
from runner.io.sqlite.schema import V1_TRANSITIONS, V9_TRANSITIONS, transition_list
from runner.leads.states import LeadState


def _state_list() -> str:
    return ", ".join(f"'{state.value}'" for state in LeadState)


V1 = (
    """
CREATE TABLE {s}.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE {s}.leads (
    seq                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text NOT NULL,
    source_lead_id     text NOT NULL,
    canonical          text NOT NULL,
    write_id           text NOT NULL UNIQUE,
    state              text NOT NULL DEFAULT 'prepared' CHECK (state IN ({states})),
    attempts           integer NOT NULL DEFAULT 0,
    reconcile_attempts integer NOT NULL DEFAULT 0,
    snapshot           text,  -- canonical JSON, compared as text (as on SQLite)
    last_polled_at     text COLLATE "C",
    accepted_at        text COLLATE "C" NOT NULL,
    updated_at         text COLLATE "C" NOT NULL,
    UNIQUE (tenant_id, source_lead_id)
);

CREATE INDEX leads_by_state ON {s}.leads (state, seq);

CREATE TABLE {s}.outbox (
    seq     bigint PRIMARY KEY,
    kind    text NOT NULL,
    subject text,
    payload jsonb NOT NULL,
    at      text NOT NULL
);

CREATE TABLE {s}.outbox_counter (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    last_seq bigint NOT NULL
);
INSERT INTO {s}.outbox_counter (last_seq) VALUES (0);

CREATE FUNCTION {s}.outbox_append(p_kind text, p_subject text, p_payload jsonb, p_at text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    next_seq bigint;
BEGIN
    UPDATE {s}.outbox_counter SET last_seq = last_seq + 1 RETURNING last_seq INTO next_seq;
    INSERT INTO {s}.outbox (seq, kind, subject, payload, at)
    VALUES (next_seq, p_kind, p_subject, p_payload, p_at);
END $$;

CREATE FUNCTION {s}.counter_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_seq <> OLD.last_seq + 1 THEN
        RAISE EXCEPTION 'the outbox counter only ever moves by one'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER counter_step BEFORE UPDATE ON {s}.outbox_counter
FOR EACH ROW EXECUTE FUNCTION {s}.counter_step();
"""
    + refuse("outbox_append_only", "outbox is append-only")
    + """
CREATE TRIGGER outbox_no_change BEFORE UPDATE OR DELETE ON {s}.outbox
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_append_only();
CREATE TRIGGER outbox_no_truncate BEFORE TRUNCATE ON {s}.outbox
FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_append_only();
CREATE TRIGGER counter_no_delete BEFORE DELETE ON {s}.outbox_counter
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_append_only();
CREATE TRIGGER counter_no_truncate BEFORE TRUNCATE ON {s}.outbox_counter
FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_append_only();
"""
    + refuse("leads_never_deleted", "lead records are never deleted")
    + """
CREATE TRIGGER leads_no_delete BEFORE DELETE ON {s}.leads
FOR EACH ROW EXECUTE FUNCTION {s}.leads_never_deleted();
CREATE TRIGGER leads_no_truncate BEFORE TRUNCATE ON {s}.leads
FOR EACH STATEMENT EXECUTE FUNCTION {s}.leads_never_deleted();

CREATE FUNCTION {s}.leads_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.source_lead_id IS DISTINCT FROM OLD.source_lead_id
       OR NEW.canonical IS DISTINCT FROM OLD.canonical
       OR NEW.write_id IS DISTINCT FROM OLD.write_id
       OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at
       OR NEW.seq IS DISTINCT FROM OLD.seq THEN
        RAISE EXCEPTION 'a lead record''s key, content and write_id never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state
       AND OLD.state || '>' || NEW.state NOT IN ({transitions}) THEN
        RAISE EXCEPTION 'illegal lead transition % -> %', OLD.state, NEW.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER leads_guard BEFORE UPDATE ON {s}.leads
FOR EACH ROW EXECUTE FUNCTION {s}.leads_guard();

CREATE FUNCTION {s}.leads_accepted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('accepted', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'state', NEW.state),
        NEW.accepted_at);
    RETURN NULL;
END $$;
CREATE TRIGGER leads_accepted AFTER INSERT ON {s}.leads
FOR EACH ROW EXECUTE FUNCTION {s}.leads_accepted();

CREATE FUNCTION {s}.leads_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('state_changed', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'from', OLD.state, 'to', NEW.state,
                           'attempts', NEW.attempts,
                           'reconcile_attempts', NEW.reconcile_attempts),
        NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER leads_state_changed AFTER UPDATE ON {s}.leads
FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state)
EXECUTE FUNCTION {s}.leads_state_changed();
"""
).replace("{states}", _state_list()).replace("{transitions}", transition_list(V1_TRANSITIONS))

#: v2, delivery (as on SQLite): the last abnormal reconcile verdict of a record, and one
#: ``target_ambiguous`` event each time it changes to a new non-empty value
V2 = """
ALTER TABLE {s}.leads ADD COLUMN reconcile_note text;

CREATE FUNCTION {s}.leads_target_ambiguous() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('target_ambiguous', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'reason', NEW.reconcile_note,
                           'reconcile_attempts', NEW.reconcile_attempts),
        NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER leads_target_ambiguous AFTER UPDATE ON {s}.leads
FOR EACH ROW WHEN (NEW.reconcile_note IS NOT NULL
                   AND NEW.reconcile_note IS DISTINCT FROM OLD.reconcile_note)
EXECUTE FUNCTION {s}.leads_target_ambiguous();
"""

#: v3, status polling (L11, L12), as on SQLite: when the snapshot last changed, one
#: ``status_changed`` event per changed snapshot (by trigger, so an unchanged poll can never
#: write one), the poll order index, and poll-health runs (one ``poll_health`` event per run
#: of the same failure; at most one run is open, enforced by a unique index)
V3 = (
    """
ALTER TABLE {s}.leads ADD COLUMN snapshot_changed_at text COLLATE "C";

CREATE INDEX leads_poll_order ON {s}.leads (state, last_polled_at NULLS FIRST, seq);

CREATE FUNCTION {s}.leads_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('status_changed', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'snapshot', NEW.snapshot::jsonb, 'previous', OLD.snapshot::jsonb),
        NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER leads_status_changed AFTER UPDATE ON {s}.leads
FOR EACH ROW WHEN (NEW.snapshot IS DISTINCT FROM OLD.snapshot)
EXECUTE FUNCTION {s}.leads_status_changed();

CREATE TABLE {s}.poll_health (
    run          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    failure      text NOT NULL,
    first_at     text NOT NULL,
    last_at      text NOT NULL,
    passes       integer NOT NULL DEFAULT 1,
    recovered_at text
);
CREATE UNIQUE INDEX poll_health_one_open ON {s}.poll_health ((true))
WHERE recovered_at IS NULL;
"""
    + refuse("poll_health_kept", "poll health runs are kept")
    + """
CREATE TRIGGER poll_health_no_delete BEFORE DELETE ON {s}.poll_health
FOR EACH ROW EXECUTE FUNCTION {s}.poll_health_kept();
CREATE TRIGGER poll_health_no_truncate BEFORE TRUNCATE ON {s}.poll_health
FOR EACH STATEMENT EXECUTE FUNCTION {s}.poll_health_kept();

CREATE FUNCTION {s}.poll_health_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('poll_health', NULL,
        jsonb_build_object('run', NEW.run, 'failure', NEW.failure, 'state', 'failing'),
        NEW.first_at);
    RETURN NULL;
END $$;
CREATE TRIGGER poll_health_event AFTER INSERT ON {s}.poll_health
FOR EACH ROW EXECUTE FUNCTION {s}.poll_health_event();
"""
)

#: v6, the pinned target (L9, issue 15), as on SQLite: the identity of the target this
#: store delivers to, pinned by the first delivery run and never changed after; one row
V6 = (
    """
CREATE TABLE {s}.target_pin (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    target_id text NOT NULL CHECK (length(target_id) > 0),
    pinned_at text NOT NULL
);
"""
    + refuse("target_pin_fixed", "the pinned target never changes")
    + """
CREATE TRIGGER target_pin_no_change BEFORE UPDATE OR DELETE ON {s}.target_pin
FOR EACH ROW EXECUTE FUNCTION {s}.target_pin_fixed();
CREATE TRIGGER target_pin_no_truncate BEFORE TRUNCATE ON {s}.target_pin
FOR EACH STATEMENT EXECUTE FUNCTION {s}.target_pin_fixed();
"""
)

#: v9, operators (E5, issue 19), as on SQLite: ``uncertain_since`` and the last reconcile
#: verdict of each record, the kept ``operator_decisions`` with their ``operator_resolved``
#: events, and the guard (replaced) allows ``uncertain -> failed_safe`` only when a
#: ``not_sent`` decision for that record at its current ``attempts`` exists.  The guard
#: also sets ``uncertain_since`` (and clears the last verdict) on a move into uncertain.
V9 = (
    """
ALTER TABLE {s}.leads ADD COLUMN uncertain_since text COLLATE "C";
ALTER TABLE {s}.leads ADD COLUMN last_reconcile text;
ALTER TABLE {s}.leads ADD COLUMN last_reconcile_at text COLLATE "C";

UPDATE {s}.leads SET uncertain_since = updated_at WHERE state = 'uncertain';

CREATE TABLE {s}.operator_decisions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      text NOT NULL,
    source_lead_id text NOT NULL,
    write_id       text NOT NULL,
    decision       text NOT NULL CHECK (decision IN ('confirmed', 'not_sent')),
    reason         text NOT NULL CHECK (length(btrim(reason)) > 0),
    readback       text,
    attempts       integer NOT NULL,
    decided_at     text COLLATE "C" NOT NULL
);
CREATE INDEX operator_decisions_by_record ON {s}.operator_decisions (write_id, attempts);
"""
    + refuse("operator_decisions_kept", "operator decisions are kept as recorded")
    + """
CREATE TRIGGER operator_decisions_no_change BEFORE UPDATE OR DELETE ON {s}.operator_decisions
FOR EACH ROW EXECUTE FUNCTION {s}.operator_decisions_kept();
CREATE TRIGGER operator_decisions_no_truncate BEFORE TRUNCATE ON {s}.operator_decisions
FOR EACH STATEMENT EXECUTE FUNCTION {s}.operator_decisions_kept();

CREATE FUNCTION {s}.operator_resolved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('operator_resolved', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'decision', NEW.decision, 'reason', NEW.reason,
                           'readback', NEW.readback, 'attempts', NEW.attempts),
        NEW.decided_at);
    RETURN NULL;
END $$;
CREATE TRIGGER operator_resolved AFTER INSERT ON {s}.operator_decisions
FOR EACH ROW EXECUTE FUNCTION {s}.operator_resolved();

CREATE OR REPLACE FUNCTION {s}.leads_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.source_lead_id IS DISTINCT FROM OLD.source_lead_id
       OR NEW.canonical IS DISTINCT FROM OLD.canonical
       OR NEW.write_id IS DISTINCT FROM OLD.write_id
       OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at
       OR NEW.seq IS DISTINCT FROM OLD.seq THEN
        RAISE EXCEPTION 'a lead record''s key, content and write_id never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF OLD.state || '>' || NEW.state NOT IN ({transitions}) THEN
            RAISE EXCEPTION 'illegal lead transition % -> %', OLD.state, NEW.state
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF OLD.state = 'uncertain' AND NEW.state = 'failed_safe' AND NOT EXISTS (
            SELECT 1 FROM {s}.operator_decisions d
            WHERE d.write_id = NEW.write_id AND d.decision = 'not_sent'
              AND d.attempts = OLD.attempts) THEN
            RAISE EXCEPTION
            'illegal lead transition: uncertain -> failed_safe needs a recorded not-sent decision'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF NEW.state = 'uncertain' THEN
            NEW.uncertain_since := NEW.updated_at;
            NEW.last_reconcile := NULL;
            NEW.last_reconcile_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END $$;
"""
).replace("{transitions}", transition_list(V9_TRANSITIONS))

#: a new store's schema (only when it does not exist yet: CREATE SCHEMA needs the CREATE
#: privilege on the database even with IF NOT EXISTS, and a DBA may have made the schema
#: for runner's role beforehand, ``CREATE SCHEMA runner AUTHORIZATION runner``)
CREATE_SCHEMA = "CREATE SCHEMA {s};"

#: the bookkeeping every version relies on; created before v1
BOOTSTRAP = """
CREATE TABLE {s}.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

#: v12, pacing and backoff (issue 16, E2): as SQLite's v12 (``next_attempt_at``, the
#: records waiting, the reconcile order)
V12 = """
ALTER TABLE {s}.leads ADD COLUMN next_attempt_at text COLLATE "C";
CREATE INDEX leads_retry_waiting ON {s}.leads (next_attempt_at) WHERE state = 'failed_safe';
CREATE INDEX leads_reconcile_order ON {s}.leads (last_reconcile_at NULLS FIRST, seq)
WHERE state = 'uncertain';
"""

#: v13, the reason of a rejected write (issue 17): as SQLite's v13 (``last_error``)
V13 = """
ALTER TABLE {s}.leads ADD COLUMN last_error text;
CREATE INDEX leads_failed_with_reason ON {s}.leads (seq)
WHERE state = 'failed_safe' AND last_error IS NOT NULL;
"""

#: v16, the row guard of ``leads`` is called only when a change needs it (issue 16): its
#: trigger gets a WHEN condition, evaluated without calling PL/pgSQL, that holds exactly
#: when ``leads_guard()`` acts (v9's function, unchanged): a key, content or write_id
#: change, a transition that is not allowed, uncertain -> failed_safe (which needs a
#: recorded not-sent decision) or an entry into uncertain (which stamps
#: ``uncertain_since``).  The changes a dispatch makes by the hundred (prepared ->
#: in_flight -> confirmed) no longer call it: a PL/pgSQL call per row was about a third of
#: the statement that finishes one batch and marks the next (20 interleaved statements
#: of 100 + 100 rows each way, trigger on and off).  SQLite's v16 is its own: the same
#: guard without an ``IN`` list, which SQLite rebuilt as an index at every row.
V16 = (
    """
DROP TRIGGER leads_guard ON {s}.leads;
CREATE TRIGGER leads_guard BEFORE UPDATE ON {s}.leads
FOR EACH ROW WHEN (
    NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
    OR NEW.source_lead_id IS DISTINCT FROM OLD.source_lead_id
    OR NEW.canonical IS DISTINCT FROM OLD.canonical
    OR NEW.write_id IS DISTINCT FROM OLD.write_id
    OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at
    OR NEW.seq IS DISTINCT FROM OLD.seq
    OR (NEW.state IS DISTINCT FROM OLD.state
        AND (OLD.state || '>' || NEW.state NOT IN ({transitions})
             OR (OLD.state = 'uncertain' AND NEW.state = 'failed_safe')
             OR NEW.state = 'uncertain')))
EXECUTE FUNCTION {s}.leads_guard();
"""
).replace("{transitions}", transition_list(V9_TRANSITIONS))

#: v19 (issue 32): the poll order index holds the confirmed records only, as on SQLite
#: (its v19): an update of a record in another state adds no entry to it.
V19 = """
DROP INDEX {s}.leads_poll_order;
CREATE INDEX leads_poll_order ON {s}.leads (last_polled_at NULLS FIRST, seq)
WHERE state = 'confirmed';
"""

#: version -> the DDL that brings version-1 to version.  Append, never edit.
MIGRATIONS: dict[int, str] = {1: V1, 2: V2, 3: V3, 4: CANDIDATES_V1, 5: PIPELINE_V1, 6: V6,
                              7: V7, 8: FIGURES_V8, 9: V9, 10: PIPELINE_V10,
                              11: V11, 12: V12, 13: V13, 14: FIGURES_V14,
                              15: PIPELINE_V15, 16: V16, 17: V17, 18: V18,
                              19: V19, 20: V20}
LATEST = max(MIGRATIONS)


def render(ddl: str, schema_ident: str) -> str:
    """The DDL with every name qualified by the (quoted) schema."""
    return ddl.replace("{s}", schema_ident)


def pending(current: int) -> list[tuple[int, str]]:
    """The migrations to apply to a store at ``current``, in order."""
    return [(v, MIGRATIONS[v]) for v in sorted(MIGRATIONS) if v > current]
