"""Schema v8 (sqlite): lead counts per state kept by triggers, for ``/metrics``
(``runner.figures`` says why; ``runner.io.sqlite.figures`` reads them)."""

from __future__ import annotations

from runner.leads.states import LeadState

V8 = f"""
CREATE TABLE lead_counts (
    state TEXT PRIMARY KEY,
    n     INTEGER NOT NULL CHECK (n >= 0)
) STRICT, WITHOUT ROWID;

INSERT INTO lead_counts (state, n)
SELECT s.state, (SELECT count(*) FROM leads WHERE leads.state = s.state)
FROM (SELECT column1 AS state FROM (VALUES {", ".join(f"('{s.value}')" for s in LeadState)})) s;

CREATE TRIGGER lead_counts_insert AFTER INSERT ON leads
BEGIN UPDATE lead_counts SET n = n + 1 WHERE state = NEW.state; END;

CREATE TRIGGER lead_counts_state AFTER UPDATE OF state ON leads
WHEN NEW.state IS NOT OLD.state
BEGIN
    UPDATE lead_counts SET n = n - 1 WHERE state = OLD.state;
    UPDATE lead_counts SET n = n + 1 WHERE state = NEW.state;
END;
"""
