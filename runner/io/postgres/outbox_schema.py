"""PostgreSQL schema versions of the outbox (SPEC K3): v7, retention (the prune floor and
the guards that keep it honest), and v11, set-based numbering (one counter move per
statement).  ``runner.io.postgres.schema`` has v1's outbox (the append-only table, the
counter row and why it is not a SEQUENCE) and lists every version in ``MIGRATIONS``.
"""

from __future__ import annotations

from runner.io.postgres.ddl import refuse

#: ``runner.pipeline.stages.raw_ingestion.CURSOR`` (not imported: opening a store stays
#: light; tests/test_retention.py keeps the two equal)
RETRIEVER_CURSOR = "raw-retriever:outbox"

#: v7, outbox retention (K3, E6, issue 15; ``runner.retention``), as on SQLite: DELETE of
#: an outbox event raises above the recorded prune floor (UPDATE and TRUNCATE still raise
#: always); the floor only moves up, never past the export watermark, the raw retriever's
#: cursor or the newest event (the counter's ``last_seq``); the watermark only moves
#: forward; every prune is recorded in ``outbox_prunes``, which never changes
V7 = (
    """
CREATE TABLE {s}.outbox_retention (
    only_row         boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    floor            bigint NOT NULL DEFAULT 0 CHECK (floor >= 0),
    export_watermark bigint CHECK (export_watermark >= 0),
    updated_at       text
);
INSERT INTO {s}.outbox_retention (floor) VALUES (0);

CREATE TABLE {s}.outbox_prunes (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    from_floor bigint NOT NULL,
    to_floor   bigint NOT NULL,
    removed    bigint NOT NULL,
    by_kind    jsonb NOT NULL,
    limited_by text NOT NULL,
    at         text NOT NULL
);
"""
    + refuse("outbox_prunes_fixed", "the prune record never changes")
    + refuse("outbox_retention_kept", "the retention row is kept")
    + """
CREATE TRIGGER outbox_prunes_no_change BEFORE UPDATE OR DELETE ON {s}.outbox_prunes
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_prunes_fixed();
CREATE TRIGGER outbox_prunes_no_truncate BEFORE TRUNCATE ON {s}.outbox_prunes
FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_prunes_fixed();
CREATE TRIGGER outbox_retention_no_delete BEFORE DELETE ON {s}.outbox_retention
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_retention_kept();
CREATE TRIGGER outbox_retention_no_truncate BEFORE TRUNCATE ON {s}.outbox_retention
FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_retention_kept();

CREATE FUNCTION {s}.outbox_retention_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    newest bigint := (SELECT last_seq FROM {s}.outbox_counter);
    cursor bigint := coalesce((SELECT position FROM {s}.pipeline_cursors
                               WHERE name = '{cursor}'), 0);
BEGIN
    IF NEW.floor < OLD.floor THEN
        RAISE EXCEPTION 'the prune floor only moves up'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.export_watermark IS NOT NULL AND (NEW.export_watermark IS NULL
                                             OR NEW.export_watermark < OLD.export_watermark)
    THEN
        RAISE EXCEPTION 'the export watermark only moves forward'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.export_watermark > newest THEN
        RAISE EXCEPTION 'the export watermark is past the newest event'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.floor > OLD.floor THEN
        IF NEW.export_watermark IS NOT NULL AND NEW.floor > NEW.export_watermark THEN
            RAISE EXCEPTION 'never prune what has not been exported'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF NEW.floor > cursor THEN
            RAISE EXCEPTION 'never prune what the raw retriever has not read'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF NEW.floor >= newest THEN
            RAISE EXCEPTION 'the newest event is always kept'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER outbox_retention_guard BEFORE UPDATE ON {s}.outbox_retention
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_retention_guard();

CREATE FUNCTION {s}.outbox_prune_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.seq > (SELECT floor FROM {s}.outbox_retention) THEN
        RAISE EXCEPTION 'outbox is append-only above its prune floor'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END $$;
DROP TRIGGER outbox_no_change ON {s}.outbox;
CREATE TRIGGER outbox_no_update BEFORE UPDATE ON {s}.outbox
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_append_only();
CREATE TRIGGER outbox_no_delete BEFORE DELETE ON {s}.outbox
FOR EACH ROW EXECUTE FUNCTION {s}.outbox_prune_guard();
"""
).replace("{cursor}", RETRIEVER_CURSOR)

#: v11, set-based outbox numbering (issue 21): the events of a whole INSERT or UPDATE of
#: ``leads`` are numbered by one statement-level trigger each, which moves the counter once
#: by the number of events (one row lock, one update) instead of once per event.  The
#: numbers stay gap-free and in commit order (the same counter row, locked until commit),
#: and within a statement follow the lead's ``seq`` and, for one lead, the order the row
#: triggers had (``state_changed``, ``status_changed``, ``target_ambiguous``).  The counter
#: still moves by exactly one when written directly; only a trigger may move it by more.
#: The kept counts per state move once per statement as well.
V11 = (
    """
CREATE OR REPLACE FUNCTION {s}.counter_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_seq <= OLD.last_seq
       OR (pg_trigger_depth() < 2 AND NEW.last_seq <> OLD.last_seq + 1) THEN
        RAISE EXCEPTION 'the outbox counter only ever moves by one'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION {s}.leads_accepted_all() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    n bigint;
    first bigint;
BEGIN
    SELECT count(*) INTO n FROM added;
    IF n > 0 THEN
        UPDATE {s}.outbox_counter SET last_seq = last_seq + n RETURNING last_seq - n INTO first;
        INSERT INTO {s}.outbox (seq, kind, subject, payload, at)
        SELECT first + row_number() OVER (ORDER BY a.seq), 'accepted', a.source_lead_id,
               jsonb_build_object('tenant_id', a.tenant_id, 'write_id', a.write_id,
                                  'state', a.state),
               a.accepted_at
        FROM added a;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER leads_accepted ON {s}.leads;
DROP FUNCTION {s}.leads_accepted();
CREATE TRIGGER leads_accepted AFTER INSERT ON {s}.leads
REFERENCING NEW TABLE AS added FOR EACH STATEMENT
EXECUTE FUNCTION {s}.leads_accepted_all();

CREATE FUNCTION {s}.leads_updated() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    n bigint;
    first bigint;
BEGIN
    -- most updates (a poll's timestamps) write no event: they leave the counter alone
    IF NOT EXISTS (
        SELECT 1 FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.state IS DISTINCT FROM o.state OR p.snapshot IS DISTINCT FROM o.snapshot
           OR (p.reconcile_note IS NOT NULL
               AND p.reconcile_note IS DISTINCT FROM o.reconcile_note)) THEN
        RETURN NULL;
    END IF;
    SELECT last_seq INTO first FROM {s}.outbox_counter FOR UPDATE;
    INSERT INTO {s}.outbox (seq, kind, subject, payload, at)
    SELECT first + row_number() OVER (ORDER BY ev.seq, ev.k), ev.kind, ev.subject,
           ev.payload, ev.at
    FROM (
        SELECT p.seq, 1 AS k, 'state_changed' AS kind, p.source_lead_id AS subject,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'from', o.state, 'to', p.state,
                                  'attempts', p.attempts,
                                  'reconcile_attempts', p.reconcile_attempts) AS payload,
               p.updated_at AS at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.state IS DISTINCT FROM o.state
        UNION ALL
        SELECT p.seq, 2, 'status_changed', p.source_lead_id,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'snapshot', p.snapshot::jsonb,
                                  'previous', o.snapshot::jsonb),
               p.updated_at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.snapshot IS DISTINCT FROM o.snapshot
        UNION ALL
        SELECT p.seq, 3, 'target_ambiguous', p.source_lead_id,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'reason', p.reconcile_note,
                                  'reconcile_attempts', p.reconcile_attempts),
               p.updated_at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.reconcile_note IS NOT NULL AND p.reconcile_note IS DISTINCT FROM o.reconcile_note
    ) ev;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE {s}.outbox_counter SET last_seq = last_seq + n;

    UPDATE {s}.lead_counts c SET n = c.n + d.k
    FROM (SELECT m.state, sum(m.k) AS k FROM (
              SELECT p.state, 1 AS k FROM new_rows p JOIN old_rows o ON o.seq = p.seq
              WHERE p.state IS DISTINCT FROM o.state
              UNION ALL
              SELECT o.state, -1 FROM new_rows p JOIN old_rows o ON o.seq = p.seq
              WHERE p.state IS DISTINCT FROM o.state) m
          GROUP BY m.state) d
    WHERE c.state = d.state AND d.k <> 0;
    RETURN NULL;
END $$;
DROP TRIGGER leads_state_changed ON {s}.leads;
DROP TRIGGER leads_status_changed ON {s}.leads;
DROP TRIGGER leads_target_ambiguous ON {s}.leads;
DROP TRIGGER lead_counts_state ON {s}.leads;
DROP FUNCTION {s}.leads_state_changed();
DROP FUNCTION {s}.leads_status_changed();
DROP FUNCTION {s}.leads_target_ambiguous();
DROP FUNCTION {s}.lead_counts_moved();
CREATE TRIGGER leads_updated AFTER UPDATE ON {s}.leads
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
EXECUTE FUNCTION {s}.leads_updated();
"""
)

#: v20 (issue 32): ``leads_updated`` moves the kept counts per state before it takes the
#: outbox counter, as an accept does (``lead_counts_insert`` fires before
#: ``leads_accepted``): every writer of ``leads`` then locks ``lead_counts``, then
#: ``outbox_counter``, then ``outbox_counts`` (a batch's mark no longer locks the counts
#: first itself, which held them over its whole transaction).  One order lets a batch's
#: outcomes commit on a session of their own beside its next batch's mark
#: (``runner.io.postgres.delivery``): the two transactions change their rows at once and
#: the second waits for the first at the counts, where with the old order (counter, then
#: counts) they could deadlock.  Same events, same numbers.
V20 = """
CREATE OR REPLACE FUNCTION {s}.leads_updated() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    n bigint;
    first bigint;
BEGIN
    -- most updates (a poll's timestamps) write no event: they leave the counter alone
    IF NOT EXISTS (
        SELECT 1 FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.state IS DISTINCT FROM o.state OR p.snapshot IS DISTINCT FROM o.snapshot
           OR (p.reconcile_note IS NOT NULL
               AND p.reconcile_note IS DISTINCT FROM o.reconcile_note)) THEN
        RETURN NULL;
    END IF;
    UPDATE {s}.lead_counts c SET n = c.n + d.k
    FROM (SELECT m.state, sum(m.k) AS k FROM (
              SELECT p.state, 1 AS k FROM new_rows p JOIN old_rows o ON o.seq = p.seq
              WHERE p.state IS DISTINCT FROM o.state
              UNION ALL
              SELECT o.state, -1 FROM new_rows p JOIN old_rows o ON o.seq = p.seq
              WHERE p.state IS DISTINCT FROM o.state) m
          GROUP BY m.state) d
    WHERE c.state = d.state AND d.k <> 0;

    SELECT last_seq INTO first FROM {s}.outbox_counter FOR UPDATE;
    INSERT INTO {s}.outbox (seq, kind, subject, payload, at)
    SELECT first + row_number() OVER (ORDER BY ev.seq, ev.k), ev.kind, ev.subject,
           ev.payload, ev.at
    FROM (
        SELECT p.seq, 1 AS k, 'state_changed' AS kind, p.source_lead_id AS subject,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'from', o.state, 'to', p.state,
                                  'attempts', p.attempts,
                                  'reconcile_attempts', p.reconcile_attempts) AS payload,
               p.updated_at AS at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.state IS DISTINCT FROM o.state
        UNION ALL
        SELECT p.seq, 2, 'status_changed', p.source_lead_id,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'snapshot', p.snapshot::jsonb,
                                  'previous', o.snapshot::jsonb),
               p.updated_at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.snapshot IS DISTINCT FROM o.snapshot
        UNION ALL
        SELECT p.seq, 3, 'target_ambiguous', p.source_lead_id,
               jsonb_build_object('tenant_id', p.tenant_id, 'write_id', p.write_id,
                                  'reason', p.reconcile_note,
                                  'reconcile_attempts', p.reconcile_attempts),
               p.updated_at
        FROM new_rows p JOIN old_rows o ON o.seq = p.seq
        WHERE p.reconcile_note IS NOT NULL AND p.reconcile_note IS DISTINCT FROM o.reconcile_note
    ) ev;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE {s}.outbox_counter SET last_seq = last_seq + n;

    RETURN NULL;
END $$;
"""
