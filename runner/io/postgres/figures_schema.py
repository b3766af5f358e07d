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

#: v14, outbox counts per kind kept by triggers (issue 21), as on SQLite: ``status`` reads
#: them instead of counting every event.  One statement-level trigger per INSERT or DELETE
#: of the outbox (the set-based numbering of v11 inserts a statement's events at once).
#: Every outbox writer holds the counter row (``outbox_counter``) before it counts; a
#: prune's delete takes it too before it counts down, so the count rows are always locked
#: after the counter row, in one order, and writers and a prune never deadlock on them.
V14 = """
CREATE TABLE {s}.outbox_counts (
    kind text PRIMARY KEY,
    n    bigint NOT NULL CHECK (n >= 0)
);

INSERT INTO {s}.outbox_counts (kind, n) SELECT kind, count(*) FROM {s}.outbox GROUP BY kind;

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
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_uncounted AFTER DELETE ON {s}.outbox
REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
EXECUTE FUNCTION {s}.outbox_uncounted();
"""
