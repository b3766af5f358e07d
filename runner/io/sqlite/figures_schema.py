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

#: v14, status at a million leads (issue 21): counts that ``status`` used to take row by
#: row, kept by triggers instead.
#:
#: * ``outbox_counts``: the events the outbox keeps, per kind (was: a scan of every event).
#:   A kind's row is made by its first event; a prune's deletes count down.
#: * ``outbox_ingested``: of those, per kind, the events the raw retriever has ingested (a
#:   D1 record ``outbox:<seq>`` exists).  The raw ingestion backlog of the tailed kinds is
#:   ``outbox_counts - outbox_ingested`` summed over them: exactly the events with no D1
#:   record (was: a scan of the outbox probing D1 for each event).  A D1 record counts when
#:   it is written for a kept event, and stops counting when either its event or the record
#:   is deleted (whichever goes first; the other then finds nothing to count down).
#:
#: Rows at 0 are not shown.  Writes pay one small upsert per event or D1 record.
V14 = """
CREATE TABLE outbox_counts (
    kind TEXT PRIMARY KEY,
    n    INTEGER NOT NULL CHECK (n >= 0)
) STRICT, WITHOUT ROWID;

CREATE TABLE outbox_ingested (
    kind TEXT PRIMARY KEY,
    n    INTEGER NOT NULL CHECK (n >= 0)
) STRICT, WITHOUT ROWID;

INSERT INTO outbox_counts (kind, n) SELECT kind, count(*) FROM outbox GROUP BY kind;

INSERT INTO outbox_ingested (kind, n)
SELECT o.kind, count(*) FROM outbox o
JOIN pipeline_records r ON r.level = 1 AND r.key = 'outbox:' || o.seq
GROUP BY o.kind;

CREATE TRIGGER outbox_counted AFTER INSERT ON outbox
BEGIN
    INSERT INTO outbox_counts (kind, n) VALUES (NEW.kind, 1)
    ON CONFLICT (kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER outbox_uncounted AFTER DELETE ON outbox
BEGIN
    UPDATE outbox_counts SET n = n - 1 WHERE kind = OLD.kind;
    UPDATE outbox_ingested SET n = n - 1
    WHERE kind = OLD.kind AND EXISTS (
        SELECT 1 FROM pipeline_records r WHERE r.level = 1 AND r.key = 'outbox:' || OLD.seq);
END;

CREATE TRIGGER raw_input_counted AFTER INSERT ON pipeline_records
WHEN NEW.level = 1 AND substr(NEW.key, 1, 7) = 'outbox:'
BEGIN
    INSERT INTO outbox_ingested (kind, n)
    SELECT o.kind, 1 FROM outbox o
    WHERE o.seq = CAST(substr(NEW.key, 8) AS INTEGER) AND 'outbox:' || o.seq = NEW.key
    ON CONFLICT (kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER raw_input_uncounted AFTER DELETE ON pipeline_records
WHEN OLD.level = 1 AND substr(OLD.key, 1, 7) = 'outbox:'
BEGIN
    UPDATE outbox_ingested SET n = n - 1
    WHERE kind = (SELECT o.kind FROM outbox o
                  WHERE o.seq = CAST(substr(OLD.key, 8) AS INTEGER)
                    AND 'outbox:' || o.seq = OLD.key);
END;
"""
