"""PostgreSQL schema v18: the store's mark, its rewinds, adopted targets and adopted
write_ids (SPEC E8, issue 30), as SQLite's v18 (``runner.io.sqlite.marks_schema`` says
why).  The row guard of ``leads`` (v17's function, replaced) lets a write_id change only
with a kept ``write_id_adoptions`` row for that very change.

The store's identity is made with the row (``gen_random_uuid``, PostgreSQL 13+), so a
promoted standby keeps it (the row is replicated) while an emptied or re-created schema
gets a new one.
"""

from __future__ import annotations

from runner.io.postgres.resend_schema import V17

#: v17's identity clause of the row guard, and v18's: a write_id may change with a kept
#: adoption row for that very change
_FIXED_WRITE_ID = "       OR NEW.write_id IS DISTINCT FROM OLD.write_id\n"
_ADOPTED_WRITE_ID = """       OR (NEW.write_id IS DISTINCT FROM OLD.write_id AND NOT EXISTS (
           SELECT 1 FROM {s}.write_id_adoptions a
           WHERE a.write_id_was = OLD.write_id AND a.write_id = NEW.write_id))
"""


def _guard_with_adoptions() -> str:
    """v17's row guard of ``leads`` (as v17 wrote it), replaced with the write_id clause
    that allows an adoption; everything else of it unchanged."""
    guard = V17[V17.index("CREATE OR REPLACE FUNCTION {s}.leads_guard()"):]
    assert guard.count(_FIXED_WRITE_ID) == 1
    return guard.replace(_FIXED_WRITE_ID, _ADOPTED_WRITE_ID)


def _kept(table: str, message: str) -> str:
    return f"""
CREATE FUNCTION {{s}}.{table}_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER {table}_no_change BEFORE UPDATE OR DELETE ON {{s}}.{table}
FOR EACH ROW EXECUTE FUNCTION {{s}}.{table}_kept();
CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table}
FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.{table}_kept();
"""


V18 = (
    """
CREATE TABLE {s}.store_marks (
    only_row     boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    store_id     text NOT NULL CHECK (length(store_id) = 32),
    epoch        bigint NOT NULL CHECK (epoch >= 1),
    counter      bigint NOT NULL CHECK (counter >= 0 AND counter < 4294967296),
    fenced_epoch bigint,
    rewind       text,
    adopting     text,
    timeline     bigint,
    replication  text,
    key_check_until text,
    updated_at   text
);
INSERT INTO {s}.store_marks (store_id, epoch, counter)
VALUES (replace(gen_random_uuid()::text, '-', ''), 1, 0);

CREATE FUNCTION {s}.store_marks_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'the store mark is kept' USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.store_id IS DISTINCT FROM OLD.store_id THEN
        RAISE EXCEPTION 'a store''s identity never changes'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.epoch < OLD.epoch OR (NEW.epoch = OLD.epoch AND NEW.counter < OLD.counter) THEN
        RAISE EXCEPTION 'a store''s mark only moves forward'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.rewind IS NOT NULL AND OLD.rewind IS NULL THEN
        PERFORM {s}.outbox_append('store_rewind', NEW.store_id,
            jsonb_build_object('epoch', NEW.epoch, 'previous', OLD.epoch,
                               'previous_counter', OLD.counter, 'reason', NEW.rewind,
                               'adopting', NEW.adopting),
            coalesce(NEW.updated_at, to_char(now() AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER store_marks_guard BEFORE UPDATE OR DELETE ON {s}.store_marks
FOR EACH ROW EXECUTE FUNCTION {s}.store_marks_guard();
CREATE TRIGGER store_marks_no_truncate BEFORE TRUNCATE ON {s}.store_marks
FOR EACH STATEMENT EXECUTE FUNCTION {s}.store_marks_guard();

CREATE TABLE {s}.target_adoptions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    previous_owner text NOT NULL,
    target_id      text,
    reason         text NOT NULL CHECK (length(reason) > 0),
    decided_at     text COLLATE "C" NOT NULL
);
"""
    + _kept("target_adoptions", "target adoptions are kept as recorded")
    + """
CREATE FUNCTION {s}.target_adopted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('target_adopted', NEW.previous_owner,
        jsonb_build_object('previous_owner', NEW.previous_owner, 'target_id', NEW.target_id,
                           'reason', NEW.reason),
        NEW.decided_at);
    RETURN NULL;
END $$;
CREATE TRIGGER target_adopted AFTER INSERT ON {s}.target_adoptions
FOR EACH ROW EXECUTE FUNCTION {s}.target_adopted();

CREATE TABLE {s}.write_id_adoptions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      text NOT NULL,
    source_lead_id text NOT NULL,
    write_id_was   text NOT NULL,
    write_id       text NOT NULL,
    decided_at     text COLLATE "C" NOT NULL
);
CREATE INDEX write_id_adoptions_by_record ON {s}.write_id_adoptions (write_id_was, write_id);
"""
    + _kept("write_id_adoptions", "write_id adoptions are kept as recorded")
    + """
CREATE FUNCTION {s}.write_id_adopted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('write_id_adopted', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id_was', NEW.write_id_was,
                           'write_id', NEW.write_id,
                           'reason', 'found at the target under this write_id, sent by a '
                                     || 'history the store forgot'),
        NEW.decided_at);
    RETURN NULL;
END $$;
CREATE TRIGGER write_id_adopted AFTER INSERT ON {s}.write_id_adoptions
FOR EACH ROW EXECUTE FUNCTION {s}.write_id_adopted();

ALTER TABLE {s}.resend_authorizations ADD COLUMN evidence text CHECK (evidence IN ('fence'));

CREATE OR REPLACE FUNCTION {s}.resend_authorized() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.outbox_append('resend_authorized', NEW.source_lead_id,
        jsonb_build_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                           'target_id', NEW.target_id, 'readback', NEW.readback,
                           'attempts', NEW.attempts,
                           'reason', CASE WHEN NEW.evidence = 'fence'
                               THEN 'the target''s fence stands above every batch the '
                                    || 'store forgot, and it holds no row'
                               ELSE 'the target deduplicates by write_id and holds no row'
                               END),
        NEW.decided_at);
    RETURN NULL;
END $$;

"""
    + _guard_with_adoptions()
)
