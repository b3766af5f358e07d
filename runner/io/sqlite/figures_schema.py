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

#: v14, outbox counts per kind kept by triggers (issue 21): ``status`` shows how many events
#: of each kind the outbox keeps; counted from the table, that was a scan of every event
#: (a million leads: at least a million rows).  A kind's row is made by its first event;
#: a prune's deletes count down, so the figure stays the events kept (rows at 0 are not
#: shown).
V14 = """
CREATE TABLE outbox_counts (
    kind TEXT PRIMARY KEY,
    n    INTEGER NOT NULL CHECK (n >= 0)
) STRICT, WITHOUT ROWID;

INSERT INTO outbox_counts (kind, n) SELECT kind, count(*) FROM outbox GROUP BY kind;

CREATE TRIGGER outbox_counted AFTER INSERT ON outbox
BEGIN
    INSERT INTO outbox_counts (kind, n) VALUES (NEW.kind, 1)
    ON CONFLICT (kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER outbox_uncounted AFTER DELETE ON outbox
BEGIN UPDATE outbox_counts SET n = n - 1 WHERE kind = OLD.kind; END;
"""
