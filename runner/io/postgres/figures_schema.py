"""Schema v8 (postgres): lead counts per state kept by triggers, for ``/metrics``
(``runner.figures`` says why; ``runner.io.postgres.figures`` reads them)."""

from __future__ import annotations

from runner.leads.states import LeadState

V8 = """
CREATE TABLE {s}.lead_counts (
    state text PRIMARY KEY,
    n     bigint NOT NULL CHECK (n >= 0)
);

INSERT INTO {s}.lead_counts (state, n)
SELECT s.state, (SELECT count(*) FROM {s}.leads l WHERE l.state = s.state)
FROM unnest(ARRAY[{states}]) AS s(state);

CREATE FUNCTION {s}.lead_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.lead_counts c SET n = c.n + a.k
    FROM (SELECT state, count(*) AS k FROM added GROUP BY state) a
    WHERE c.state = a.state;
    RETURN NULL;
END $$;
CREATE TRIGGER lead_counts_insert AFTER INSERT ON {s}.leads
REFERENCING NEW TABLE AS added FOR EACH STATEMENT
EXECUTE FUNCTION {s}.lead_counts_inserted();

CREATE FUNCTION {s}.lead_counts_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.lead_counts SET n = n - 1 WHERE state = OLD.state;
    UPDATE {s}.lead_counts SET n = n + 1 WHERE state = NEW.state;
    RETURN NULL;
END $$;
CREATE TRIGGER lead_counts_state AFTER UPDATE ON {s}.leads
FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state)
EXECUTE FUNCTION {s}.lead_counts_moved();
""".replace("{states}", ", ".join(f"'{s.value}'" for s in LeadState))

#: v14, status at a million leads (issue 21), as on SQLite: ``outbox_counts`` (the events
#: kept, per kind) and ``outbox_ingested`` (of those, the ones with a D1 record), so
#: ``status`` and the raw ingestion backlog read kept counts instead of scanning the outbox.
#: One statement-level trigger per INSERT or DELETE (the set-based numbering of v11 inserts
#: a statement's events at once).
#:
#: Locks: every outbox writer holds the counter row (``outbox_counter``) before it counts,
#: and a prune's delete takes it too, so ``outbox_counts`` rows are always locked after the
#: counter.  ``outbox_ingested`` is touched by ingestion and prunes only (never by accept or
#: dispatch, so they never wait on it), and always locked in kind order.
V14 = """
CREATE TABLE {s}.outbox_counts (
    kind text PRIMARY KEY,
    n    bigint NOT NULL CHECK (n >= 0)
);

CREATE TABLE {s}.outbox_ingested (
    kind text PRIMARY KEY,
    n    bigint NOT NULL CHECK (n >= 0)
);

INSERT INTO {s}.outbox_counts (kind, n) SELECT kind, count(*) FROM {s}.outbox GROUP BY kind;

INSERT INTO {s}.outbox_ingested (kind, n)
SELECT o.kind, count(*) FROM {s}.outbox o
JOIN {s}.pipeline_records r ON r.level = 1 AND r.key = 'outbox:' || o.seq
GROUP BY o.kind;

CREATE FUNCTION {s}.outbox_counted() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
BEGIN
    INSERT INTO {s}.outbox_counts AS c (kind, n)
    SELECT kind, count(*) FROM added GROUP BY kind ORDER BY kind
    ON CONFLICT (kind) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_counted AFTER INSERT ON {s}.outbox
REFERENCING NEW TABLE AS added FOR EACH STATEMENT
EXECUTE FUNCTION {s}.outbox_counted();

CREATE FUNCTION {s}.outbox_uncounted() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
BEGIN
    PERFORM 1 FROM {s}.outbox_counter FOR UPDATE;
    UPDATE {s}.outbox_counts c SET n = c.n - d.k
    FROM (SELECT kind, count(*) AS k FROM removed GROUP BY kind) d
    WHERE c.kind = d.kind;
    PERFORM 1 FROM {s}.outbox_ingested
    WHERE kind IN (SELECT kind FROM removed) ORDER BY kind FOR UPDATE;
    UPDATE {s}.outbox_ingested c SET n = c.n - d.k
    FROM (SELECT r.kind, count(*) AS k FROM removed r
          JOIN {s}.pipeline_records p ON p.level = 1 AND p.key = 'outbox:' || r.seq
          GROUP BY r.kind) d
    WHERE c.kind = d.kind;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_uncounted AFTER DELETE ON {s}.outbox
REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
EXECUTE FUNCTION {s}.outbox_uncounted();

-- the event a D1 record was ingested from: 'outbox:<seq>' exactly (no cast of other keys)
CREATE FUNCTION {s}.raw_input_seq(key text) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN key ~ '^outbox:[1-9][0-9]{0,17}$' THEN substr(key, 8)::bigint END
$$;

CREATE FUNCTION {s}.raw_input_counted() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
BEGIN
    INSERT INTO {s}.outbox_ingested AS c (kind, n)
    SELECT o.kind, count(*) FROM added a
    JOIN {s}.outbox o ON o.seq = {s}.raw_input_seq(a.key)
    WHERE a.level = 1
    GROUP BY o.kind ORDER BY o.kind
    ON CONFLICT (kind) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;
CREATE TRIGGER raw_input_counted AFTER INSERT ON {s}.pipeline_records
REFERENCING NEW TABLE AS added FOR EACH STATEMENT
EXECUTE FUNCTION {s}.raw_input_counted();

CREATE FUNCTION {s}.raw_input_uncounted() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
BEGIN
    PERFORM 1 FROM {s}.outbox_ingested
    WHERE kind IN (SELECT o.kind FROM removed a
                   JOIN {s}.outbox o ON o.seq = {s}.raw_input_seq(a.key)
                   WHERE a.level = 1)
    ORDER BY kind FOR UPDATE;
    UPDATE {s}.outbox_ingested c SET n = c.n - d.k
    FROM (SELECT o.kind, count(*) AS k FROM removed a
          JOIN {s}.outbox o ON o.seq = {s}.raw_input_seq(a.key)
          WHERE a.level = 1
          GROUP BY o.kind) d
    WHERE c.kind = d.kind;
    RETURN NULL;
END $$;
CREATE TRIGGER raw_input_uncounted AFTER DELETE ON {s}.pipeline_records
REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
EXECUTE FUNCTION {s}.raw_input_uncounted();
"""
