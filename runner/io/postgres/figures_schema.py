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
