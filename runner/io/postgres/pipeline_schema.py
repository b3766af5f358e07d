"""PostgreSQL DDL for staged processing (SPEC P1-P4, P9): migration v5, as on SQLite.

The same tables and invariants as ``runner.io.sqlite.pipeline_schema``, enforced by the
database: a new or changed record enters the backlog of the current processors of the
next stage (trigger); records, work rows and both histories are never deleted (from v10: only what
``pipeline prune`` may remove, ``PIPELINE_V10``); a replaced
payload and a replaced outcome are kept with their provenance (triggers); pipeline
bookkeeping writes no outbox event.  Payloads are canonical JSON *text*, so "the same
result" is byte-equal on both backends; keys compare byte-wise (``COLLATE "C"``).

The fencing token comes from a SEQUENCE: it only has to grow, gaps do not matter.

Wake-ups (P9): new inputs notify the channel ``runner_pipeline`` with the payload
``<schema>:<level>`` (``<schema>:0`` for new outbox events), once per statement and
level; PostgreSQL folds identical notifications of one transaction into one.  A session
that sets ``runner.pipeline_notify = off`` (for example ``?runner.pipeline_notify=off`` on
its DSN) writes without notifying: consumers then rely on polling alone, which is what the
tests use to show that a lost notification loses nothing.
"""

from __future__ import annotations

from runner.io.postgres.ddl import refuse

CHANNEL = "runner_pipeline"
_KINDS = "'output', 'no_output', 'not_applicable', 'unsupported', 'failed'"

_READERS = """
        SELECT NEW.id, p.name, p.version, 'pending', NEW.updated_ms, NEW.rev
        FROM {s}.pipeline_processors p
        WHERE p.input_level = NEW.level
          AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors q
                          WHERE q.name = p.name AND q.version > p.version)"""


PIPELINE_V1 = (
    f"""
CREATE TABLE {{s}}.pipeline_processors (
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    stage         text NOT NULL,
    input_level   integer NOT NULL CHECK (input_level BETWEEN 1 AND 3),
    capability    text NOT NULL,
    rebacklog     boolean NOT NULL,
    registered_ms bigint NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE {{s}}.pipeline_records (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    level      integer NOT NULL CHECK (level BETWEEN 1 AND 4),
    key        text COLLATE "C" NOT NULL,
    payload    text NOT NULL,
    orders     text,
    rev        integer NOT NULL DEFAULT 1,
    processor  text NOT NULL,
    version    integer NOT NULL,
    input_id   bigint,
    updated_ms bigint NOT NULL,
    UNIQUE (level, key)
);

CREATE TABLE {{s}}.pipeline_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_id   bigint NOT NULL REFERENCES {{s}}.pipeline_records (id),
    rev         integer NOT NULL,
    payload     text NOT NULL,
    processor   text NOT NULL,
    version     integer NOT NULL,
    input_id    bigint,
    replaced_ms bigint NOT NULL,
    UNIQUE (record_id, rev)
);

CREATE TABLE {{s}}.pipeline_work (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    input_id     bigint NOT NULL REFERENCES {{s}}.pipeline_records (id),
    processor    text NOT NULL,
    version      integer NOT NULL,
    state        text NOT NULL CHECK (state IN ('pending', 'claimed', 'done')),
    available_at bigint NOT NULL,
    owner        text,
    fence        bigint,
    attempts     integer NOT NULL DEFAULT 0,
    input_rev    integer NOT NULL DEFAULT 0,
    outcome      text CHECK (outcome IN ({_KINDS})),
    error        text,
    retryable    integer,
    done_ms      bigint,
    UNIQUE (input_id, processor, version),
    CHECK (state <> 'claimed' OR (owner IS NOT NULL AND fence IS NOT NULL)),
    CHECK (state <> 'done' OR outcome IS NOT NULL)
);

CREATE INDEX pipeline_work_claimable ON {{s}}.pipeline_work (processor, version, available_at)
    WHERE state <> 'done';
CREATE INDEX pipeline_work_held ON {{s}}.pipeline_work (fence) WHERE state = 'claimed';

CREATE TABLE {{s}}.pipeline_outcome_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    work_id     bigint NOT NULL REFERENCES {{s}}.pipeline_work (id),
    processor   text NOT NULL,
    version     integer NOT NULL,
    input_id    bigint NOT NULL,
    input_rev   integer NOT NULL,
    outcome     text NOT NULL,
    error       text,
    retryable   integer,
    done_ms     bigint,
    replaced_ms bigint NOT NULL
);

CREATE SEQUENCE {{s}}.pipeline_fence_seq;

CREATE TABLE {{s}}.pipeline_cursors (
    name       text PRIMARY KEY,
    position   bigint NOT NULL,
    updated_ms bigint NOT NULL
);

CREATE TABLE {{s}}.pipeline_worker_config (
    worker     text PRIMARY KEY,
    desired    text,
    effective  text NOT NULL,
    error      text,
    updated_at text NOT NULL
);
"""
    + refuse("pipeline_kept", "pipeline records, outcomes and history are never deleted")
    + refuse("pipeline_history_fixed", "pipeline history never changes")
    + """
CREATE TRIGGER pipeline_records_no_delete BEFORE DELETE ON {s}.pipeline_records
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_kept();
CREATE TRIGGER pipeline_records_no_truncate BEFORE TRUNCATE ON {s}.pipeline_records
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_kept();
CREATE TRIGGER pipeline_work_no_delete BEFORE DELETE ON {s}.pipeline_work
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_kept();
CREATE TRIGGER pipeline_work_no_truncate BEFORE TRUNCATE ON {s}.pipeline_work
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_kept();
CREATE TRIGGER pipeline_history_no_change BEFORE UPDATE OR DELETE ON {s}.pipeline_history
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_history_fixed();
CREATE TRIGGER pipeline_outcome_history_no_change
BEFORE UPDATE OR DELETE ON {s}.pipeline_outcome_history
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_history_fixed();

CREATE FUNCTION {s}.pipeline_records_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.level IS DISTINCT FROM OLD.level OR NEW.key IS DISTINCT FROM OLD.key
       OR NEW.id IS DISTINCT FROM OLD.id THEN
        RAISE EXCEPTION 'a pipeline record''s level and key never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.payload IS DISTINCT FROM OLD.payload THEN
        INSERT INTO {s}.pipeline_history
            (record_id, rev, payload, processor, version, input_id, replaced_ms)
        VALUES (OLD.id, OLD.rev, OLD.payload, OLD.processor, OLD.version, OLD.input_id,
                NEW.updated_ms);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER pipeline_records_guard BEFORE UPDATE ON {s}.pipeline_records
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_records_guard();

CREATE FUNCTION {s}.pipeline_records_backlog() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {s}.pipeline_work
            (input_id, processor, version, state, available_at, input_rev)
"""
    + _READERS
    + """
        ON CONFLICT (input_id, processor, version) DO NOTHING;
    ELSE
        INSERT INTO {s}.pipeline_work AS w
            (input_id, processor, version, state, available_at, input_rev)
"""
    + _READERS
    + """
        ON CONFLICT (input_id, processor, version) DO UPDATE
        SET state = 'pending', available_at = excluded.available_at
        WHERE w.state = 'done';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER pipeline_records_new AFTER INSERT ON {s}.pipeline_records
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_records_backlog();
CREATE TRIGGER pipeline_records_changed AFTER UPDATE ON {s}.pipeline_records
FOR EACH ROW WHEN (NEW.rev IS DISTINCT FROM OLD.rev)
EXECUTE FUNCTION {s}.pipeline_records_backlog();

-- only a completion sets done_ms: one history row per recorded outcome it replaces
CREATE FUNCTION {s}.pipeline_outcome_replaced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.pipeline_outcome_history
        (work_id, processor, version, input_id, input_rev, outcome, error, retryable,
         done_ms, replaced_ms)
    VALUES (OLD.id, OLD.processor, OLD.version, OLD.input_id, OLD.input_rev, OLD.outcome,
            OLD.error, OLD.retryable, OLD.done_ms, NEW.done_ms);
    RETURN NULL;
END $$;
CREATE TRIGGER pipeline_work_outcome_replaced AFTER UPDATE OF done_ms ON {s}.pipeline_work
FOR EACH ROW WHEN (OLD.outcome IS NOT NULL)
EXECUTE FUNCTION {s}.pipeline_outcome_replaced();

-- wake-ups: one notification per statement and level (never for pipeline bookkeeping of
-- the outbox: raw ingestion is woken by the outbox itself)
CREATE FUNCTION {s}.pipeline_notify_levels() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lvl integer;
BEGIN
    IF current_setting('runner.pipeline_notify', true) IS DISTINCT FROM 'off' THEN
        FOR lvl IN SELECT DISTINCT level FROM new_rows LOOP
            PERFORM pg_notify('"""
    + CHANNEL
    + """', TG_TABLE_SCHEMA || ':' || lvl);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER pipeline_records_notify_insert AFTER INSERT ON {s}.pipeline_records
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_notify_levels();
CREATE TRIGGER pipeline_records_notify_update AFTER UPDATE ON {s}.pipeline_records
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_notify_levels();

CREATE FUNCTION {s}.pipeline_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('runner.pipeline_notify', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_notify('"""
    + CHANNEL
    + """', TG_TABLE_SCHEMA || ':0');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify_pipeline AFTER INSERT ON {s}.outbox
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_notify_outbox();
"""
)


#: v10, the pipeline's retention (issue 15 point 11; ``runner.pipeline.retention``), as on
#: SQLite: a work row is removed only once ``done``, and only when its record may be
#: removed; a record only with no work row left
#: on it, not merged, not at D4, with no kept non-merged record made from it, and (at D1)
#: once its outbox event is gone; histories still never change but may lose rows; every
#: prune is recorded in ``pipeline_prunes``.  TRUNCATE stays refused.
PIPELINE_V10 = (
    """
DROP TRIGGER pipeline_records_no_delete ON {s}.pipeline_records;
DROP TRIGGER pipeline_work_no_delete ON {s}.pipeline_work;
DROP TRIGGER pipeline_history_no_change ON {s}.pipeline_history;
DROP TRIGGER pipeline_outcome_history_no_change ON {s}.pipeline_outcome_history;
CREATE TRIGGER pipeline_history_no_change BEFORE UPDATE ON {s}.pipeline_history
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_history_fixed();
CREATE TRIGGER pipeline_outcome_history_no_change BEFORE UPDATE ON {s}.pipeline_outcome_history
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_history_fixed();

CREATE INDEX pipeline_records_made_from ON {s}.pipeline_records (input_id)
    WHERE orders IS NULL;
-- removing a work row checks its replaced outcomes (the foreign key): without an index,
-- a scan of the whole history per row removed
CREATE INDEX pipeline_outcome_history_work ON {s}.pipeline_outcome_history (work_id);

CREATE TABLE {s}.pipeline_prunes (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    before_ms bigint NOT NULL,
    removed   jsonb NOT NULL,
    at        text NOT NULL
);
"""
    + refuse("pipeline_prunes_fixed", "the prune record never changes")
    + """
CREATE TRIGGER pipeline_prunes_no_change BEFORE UPDATE OR DELETE ON {s}.pipeline_prunes
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_prunes_fixed();
CREATE TRIGGER pipeline_prunes_no_truncate BEFORE TRUNCATE ON {s}.pipeline_prunes
FOR EACH STATEMENT EXECUTE FUNCTION {s}.pipeline_prunes_fixed();

CREATE FUNCTION {s}.pipeline_work_prune_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> 'done' THEN
        RAISE EXCEPTION 'pipeline work is removed only once done'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS (
        SELECT 1 FROM {s}.pipeline_records r
        WHERE r.id = OLD.input_id
          AND (r.level = 4 OR r.orders IS NOT NULL
               OR EXISTS (SELECT 1 FROM {s}.pipeline_records c
                          WHERE c.input_id = r.id AND c.orders IS NULL
                            AND c.level = r.level + 1)
               OR (r.level = 1
                   AND CASE WHEN r.key ~ '^outbox:[0-9]{1,18}$'
                            THEN substr(r.key, 8)::bigint
                                 > (SELECT floor FROM {s}.outbox_retention)
                            ELSE true END))) THEN
        RAISE EXCEPTION 'the outcomes of a kept pipeline record are kept'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER pipeline_work_prune_guard BEFORE DELETE ON {s}.pipeline_work
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_work_prune_guard();

CREATE FUNCTION {s}.pipeline_records_prune_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.level = 4 OR OLD.orders IS NOT NULL THEN
        RAISE EXCEPTION 'merged records and D4 are kept'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM {s}.pipeline_work WHERE input_id = OLD.id) THEN
        RAISE EXCEPTION 'a pipeline record with work on it is kept'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors WHERE input_level = OLD.level) THEN
        RAISE EXCEPTION 'a pipeline record no processor has read is kept'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM {s}.pipeline_records c
               WHERE c.input_id = OLD.id AND c.orders IS NULL
                 AND c.level = OLD.level + 1) THEN
        RAISE EXCEPTION 'a pipeline record is kept while a record made from it is'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.level = 1 THEN
        IF OLD.key !~ '^outbox:[0-9]{1,18}$' THEN
            RAISE EXCEPTION 'a D1 record is kept while its outbox event is'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF substr(OLD.key, 8)::bigint > (SELECT floor FROM {s}.outbox_retention) THEN
            RAISE EXCEPTION 'a D1 record is kept while its outbox event is'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER pipeline_records_prune_guard BEFORE DELETE ON {s}.pipeline_records
FOR EACH ROW EXECUTE FUNCTION {s}.pipeline_records_prune_guard();
"""
)


#: v15, the pipeline prune's scan (issue 15 point 12): a round's candidates of one level in
#: id order, the unmerged records only, so that a round reads about as many records as it
#: removes instead of every record of every level before them (``pipeline prune`` took
#: 53 s at 386k pipeline rows in the PostgreSQL soak).  D4 is never pruned and stays out
#: of it: kept entries between pruned ones would leave its pages sparse for good
PIPELINE_V15 = """
CREATE INDEX pipeline_records_prunable ON {s}.pipeline_records (level, id)
    WHERE orders IS NULL AND level < 4;
"""
