"""PostgreSQL schema v17: resends runner authorises itself on a deduplicating target
(SPEC E7, issue 29), as SQLite's v17 (``runner.io.sqlite.resend_schema`` says why): the
kept ``resend_authorizations`` with one ``resend_authorized`` outbox event each, and the
row guard of ``leads`` (v9's function, replaced) accepts either an operator's ``not_sent``
decision or runner's authorisation at the record's current ``attempts`` for
``uncertain -> failed_safe``.  v16's WHEN condition already calls the guard for that move.
It adds ``last_failure`` as on SQLite.
"""

from __future__ import annotations

from runner.io.sqlite.schema import V9_TRANSITIONS, transition_list

V17 = (
    """
ALTER TABLE {s}.leads ADD COLUMN last_failure text;

CREATE TABLE {s}.resend_authorizations (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      text NOT NULL,
    source_lead_id text NOT NULL,
    write_id       text NOT NULL,
    target_id      text,
    attempts       integer NOT NULL,
    readback       text NOT NULL CHECK (readback = 'none'),
    decided_at     text COLLATE "C" NOT NULL
);
CREATE INDEX resend_authorizations_by_record ON {s}.resend_authorizations (write_id, attempts);

CREATE FUNCTION {s}.resend_authorizations_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'resend authorizations are kept as recorded'
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER resend_authorizations_no_change
BEFORE UPDATE OR DELETE ON {s}.resend_authorizations
FOR EACH ROW EXECUTE FUNCTION {s}.resend_authorizations_kept();
CREATE TRIGGER resend_authorizations_no_truncate BEFORE TRUNCATE ON {s}.resend_authorizations
FOR EACH STATEMENT EXECUTE FUNCTION {s}.resend_authorizations_kept();

CREATE FUNCTION {s}.resend_authorized() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('resend_authorized', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'target_id', NEW.target_id, 'readback', NEW.readback,
                           'attempts', NEW.attempts,
                           'reason', 'the target deduplicates by write_id and holds no row'),
        NEW.decided_at);
    RETURN NULL;
END $$;
CREATE TRIGGER resend_authorized AFTER INSERT ON {s}.resend_authorizations
FOR EACH ROW EXECUTE FUNCTION {s}.resend_authorized();

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
              AND d.attempts = OLD.attempts) AND NOT EXISTS (
            SELECT 1 FROM {s}.resend_authorizations r
            WHERE r.write_id = NEW.write_id AND r.attempts = OLD.attempts) THEN
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
