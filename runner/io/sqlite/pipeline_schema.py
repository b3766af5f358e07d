"""SQLite DDL for staged processing (SPEC P1-P4), one migration of its own.

Tables:

* ``pipeline_records``: the durable levels D1-D4, one row per (level, natural key).  A
  rewrite with the same canonical payload changes nothing; a different one bumps ``rev``
  and keeps the previous payload, with its provenance, in ``pipeline_history`` (trigger).
* ``pipeline_work``: one row per (input, processor, version): the claim (owner, fencing
  token, lease expiry) while it runs, then its durable outcome.  ``available_at`` (epoch
  ms) is when a pending row is due (retry backoff) or when a claimed row's lease runs
  out: either way the row is claimable once ``available_at <= now``, through one partial
  index that never holds terminal rows.
* ``pipeline_processors``: every (name, version) that ran; the current version of a
  processor is its highest.  ``pipeline_cursors``, ``pipeline_fence`` (the fencing
  token counter), ``pipeline_worker_config`` (desired and effective configurations).

Invariants the schema keeps by itself, whatever the query:

* a new record, and every change of a record, puts it in the backlog of the current
  processors of the next stage (trigger): no code path can forget downstream work;
* records, work rows and both histories are never deleted (from v10: only what
  ``pipeline prune`` may remove, ``PIPELINE_V10``); histories never change;
* a recorded outcome that is replaced (force replay, retry, changed input) is kept in
  ``pipeline_outcome_history`` with its provenance (trigger);
* no outbox event is ever written by pipeline bookkeeping.
"""

from __future__ import annotations

_KINDS = "'output', 'no_output', 'not_applicable', 'unsupported', 'failed'"

#: the processors of the stage that reads a level, at their current version
_CURRENT_READERS = """
SELECT NEW.id, p.name, p.version, 'pending', NEW.updated_ms, NEW.rev
FROM pipeline_processors p
WHERE p.input_level = NEW.level
  AND NOT EXISTS (SELECT 1 FROM pipeline_processors q
                  WHERE q.name = p.name AND q.version > p.version)
"""

PIPELINE_V1 = f"""
CREATE TABLE pipeline_processors (
    name          TEXT NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 1),
    stage         TEXT NOT NULL,
    input_level   INTEGER NOT NULL CHECK (input_level BETWEEN 1 AND 3),
    capability    TEXT NOT NULL,
    rebacklog     INTEGER NOT NULL CHECK (rebacklog IN (0, 1)),
    registered_ms INTEGER NOT NULL,
    PRIMARY KEY (name, version)
) STRICT;

CREATE TABLE pipeline_records (
    id         INTEGER PRIMARY KEY,
    level      INTEGER NOT NULL CHECK (level BETWEEN 1 AND 4),
    key        TEXT NOT NULL,
    payload    TEXT NOT NULL,
    orders     TEXT,
    rev        INTEGER NOT NULL DEFAULT 1,
    processor  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    input_id   INTEGER,
    updated_ms INTEGER NOT NULL,
    UNIQUE (level, key)
) STRICT;

CREATE TABLE pipeline_history (
    id          INTEGER PRIMARY KEY,
    record_id   INTEGER NOT NULL REFERENCES pipeline_records (id),
    rev         INTEGER NOT NULL,
    payload     TEXT NOT NULL,
    processor   TEXT NOT NULL,
    version     INTEGER NOT NULL,
    input_id    INTEGER,
    replaced_ms INTEGER NOT NULL,
    UNIQUE (record_id, rev)
) STRICT;

CREATE TABLE pipeline_work (
    id           INTEGER PRIMARY KEY,
    input_id     INTEGER NOT NULL REFERENCES pipeline_records (id),
    processor    TEXT NOT NULL,
    version      INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'done')),
    available_at INTEGER NOT NULL,
    owner        TEXT,
    fence        INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    input_rev    INTEGER NOT NULL DEFAULT 0,
    outcome      TEXT CHECK (outcome IN ({_KINDS})),
    error        TEXT,
    retryable    INTEGER,
    done_ms      INTEGER,
    UNIQUE (input_id, processor, version),
    CHECK (state <> 'claimed' OR (owner IS NOT NULL AND fence IS NOT NULL)),
    CHECK (state <> 'done' OR outcome IS NOT NULL)
) STRICT;

CREATE INDEX pipeline_work_claimable ON pipeline_work (processor, version, available_at)
    WHERE state <> 'done';
CREATE INDEX pipeline_work_held ON pipeline_work (fence) WHERE state = 'claimed';

CREATE TABLE pipeline_outcome_history (
    id          INTEGER PRIMARY KEY,
    work_id     INTEGER NOT NULL REFERENCES pipeline_work (id),
    processor   TEXT NOT NULL,
    version     INTEGER NOT NULL,
    input_id    INTEGER NOT NULL,
    input_rev   INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    error       TEXT,
    retryable   INTEGER,
    done_ms     INTEGER,
    replaced_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE pipeline_fence (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    last INTEGER NOT NULL
) STRICT;
INSERT INTO pipeline_fence (one, last) VALUES (1, 0);

CREATE TABLE pipeline_cursors (
    name       TEXT PRIMARY KEY,
    position   INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE pipeline_worker_config (
    worker     TEXT PRIMARY KEY,
    desired    TEXT,
    effective  TEXT NOT NULL,
    error      TEXT,
    updated_at TEXT NOT NULL
) STRICT;

CREATE TRIGGER pipeline_records_no_delete BEFORE DELETE ON pipeline_records
BEGIN SELECT RAISE(ABORT, 'pipeline records are never deleted'); END;

CREATE TRIGGER pipeline_work_no_delete BEFORE DELETE ON pipeline_work
BEGIN SELECT RAISE(ABORT, 'pipeline outcomes are never deleted'); END;

CREATE TRIGGER pipeline_history_fixed BEFORE UPDATE ON pipeline_history
BEGIN SELECT RAISE(ABORT, 'pipeline history never changes'); END;

CREATE TRIGGER pipeline_history_kept BEFORE DELETE ON pipeline_history
BEGIN SELECT RAISE(ABORT, 'pipeline history never changes'); END;

CREATE TRIGGER pipeline_outcome_history_fixed BEFORE UPDATE ON pipeline_outcome_history
BEGIN SELECT RAISE(ABORT, 'pipeline history never changes'); END;

CREATE TRIGGER pipeline_outcome_history_kept BEFORE DELETE ON pipeline_outcome_history
BEGIN SELECT RAISE(ABORT, 'pipeline history never changes'); END;

CREATE TRIGGER pipeline_records_identity BEFORE UPDATE OF level, key ON pipeline_records
WHEN NEW.level IS NOT OLD.level OR NEW.key IS NOT OLD.key
BEGIN SELECT RAISE(ABORT, 'a pipeline record''s level and key never change'); END;

CREATE TRIGGER pipeline_records_replaced BEFORE UPDATE OF payload ON pipeline_records
WHEN NEW.payload IS NOT OLD.payload
BEGIN
    INSERT INTO pipeline_history
        (record_id, rev, payload, processor, version, input_id, replaced_ms)
    VALUES (OLD.id, OLD.rev, OLD.payload, OLD.processor, OLD.version, OLD.input_id,
            NEW.updated_ms);
END;

CREATE TRIGGER pipeline_records_backlog AFTER INSERT ON pipeline_records
BEGIN
    INSERT INTO pipeline_work (input_id, processor, version, state, available_at, input_rev)
    {_CURRENT_READERS}
    ON CONFLICT (input_id, processor, version) DO NOTHING;
END;

CREATE TRIGGER pipeline_records_changed AFTER UPDATE OF rev ON pipeline_records
WHEN NEW.rev IS NOT OLD.rev
BEGIN
    INSERT INTO pipeline_work (input_id, processor, version, state, available_at, input_rev)
    {_CURRENT_READERS}
    ON CONFLICT (input_id, processor, version) DO UPDATE
    SET state = 'pending', available_at = excluded.available_at
    WHERE pipeline_work.state = 'done';
END;

-- only a completion sets done_ms: it fires once per recorded outcome that replaces one
CREATE TRIGGER pipeline_work_outcome_replaced AFTER UPDATE OF done_ms ON pipeline_work
WHEN OLD.outcome IS NOT NULL
BEGIN
    INSERT INTO pipeline_outcome_history
        (work_id, processor, version, input_id, input_rev, outcome, error, retryable,
         done_ms, replaced_ms)
    VALUES (OLD.id, OLD.processor, OLD.version, OLD.input_id, OLD.input_rev, OLD.outcome,
            OLD.error, OLD.retryable, OLD.done_ms, NEW.done_ms);
END;
"""

#: v10, the pipeline's retention (issue 15 point 11; ``runner.pipeline.retention``).
#: ``runner pipeline prune`` may remove what is finished; the schema refuses the rest,
#: whatever the query:
#:
#: * a work row is removed only once it is ``done`` (never pending, claimed or leased),
#:   and only when its record may be removed (below): a kept record keeps its outcomes;
#: * a record is removed only when no work row is left on it, some processor reads its
#:   level, it is not merged (``orders`` is NULL), it is not at D4, no kept non-merged
#:   record was made from it,
#:   and (at D1) its outbox event is gone (at or below the outbox's prune floor);
#: * histories still never change; they may only lose rows (old ones, or a removed
#:   record's);
#: * every prune is recorded in ``pipeline_prunes``, which never changes.
PIPELINE_V10 = """
DROP TRIGGER pipeline_records_no_delete;
DROP TRIGGER pipeline_work_no_delete;
DROP TRIGGER pipeline_history_kept;
DROP TRIGGER pipeline_outcome_history_kept;

CREATE INDEX pipeline_records_made_from ON pipeline_records (input_id)
    WHERE orders IS NULL;
-- removing a work row checks its replaced outcomes (the foreign key): without an index,
-- a scan of the whole history per row removed
CREATE INDEX pipeline_outcome_history_work ON pipeline_outcome_history (work_id);

CREATE TABLE pipeline_prunes (
    id        INTEGER PRIMARY KEY,
    before_ms INTEGER NOT NULL,
    removed   TEXT NOT NULL,
    at        TEXT NOT NULL
) STRICT;

CREATE TRIGGER pipeline_prunes_fixed BEFORE UPDATE ON pipeline_prunes
BEGIN SELECT RAISE(ABORT, 'the prune record never changes'); END;
CREATE TRIGGER pipeline_prunes_kept BEFORE DELETE ON pipeline_prunes
BEGIN SELECT RAISE(ABORT, 'the prune record never changes'); END;

CREATE TRIGGER pipeline_work_prune_guard BEFORE DELETE ON pipeline_work
BEGIN
    SELECT RAISE(ABORT, 'pipeline work is removed only once done')
    WHERE OLD.state <> 'done';
    SELECT RAISE(ABORT, 'the outcomes of a kept pipeline record are kept')
    WHERE EXISTS (
        SELECT 1 FROM pipeline_records r
        WHERE r.id = OLD.input_id
          AND (r.level = 4 OR r.orders IS NOT NULL
               OR EXISTS (SELECT 1 FROM pipeline_records c
                          WHERE c.input_id = r.id AND c.orders IS NULL
                            AND c.level = r.level + 1)
               OR (r.level = 1
                   AND (r.key NOT GLOB 'outbox:[0-9]*'
                        OR CAST(substr(r.key, 8) AS INTEGER)
                           > (SELECT floor FROM outbox_retention)))));
END;

CREATE TRIGGER pipeline_records_prune_guard BEFORE DELETE ON pipeline_records
BEGIN
    SELECT RAISE(ABORT, 'merged records and D4 are kept')
    WHERE OLD.level = 4 OR OLD.orders IS NOT NULL;
    SELECT RAISE(ABORT, 'a pipeline record with work on it is kept')
    WHERE EXISTS (SELECT 1 FROM pipeline_work WHERE input_id = OLD.id);
    SELECT RAISE(ABORT, 'a pipeline record no processor has read is kept')
    WHERE NOT EXISTS (SELECT 1 FROM pipeline_processors WHERE input_level = OLD.level);
    SELECT RAISE(ABORT, 'a pipeline record is kept while a record made from it is')
    WHERE EXISTS (SELECT 1 FROM pipeline_records c
                  WHERE c.input_id = OLD.id AND c.orders IS NULL
                    AND c.level = OLD.level + 1);
    SELECT RAISE(ABORT, 'a D1 record is kept while its outbox event is')
    WHERE OLD.level = 1
      AND (OLD.key NOT GLOB 'outbox:[0-9]*'
           OR CAST(substr(OLD.key, 8) AS INTEGER) > (SELECT floor FROM outbox_retention));
END;
"""


#: v15 is PostgreSQL's index for the pipeline prune's scan (issue 15 point 12); SQLite
#: reads a level's records in id order from the table itself (ordered by its rowid), and
#: the same index measured no faster here (2.5-3.6 s a prune of 385k rows either way), so
#: on SQLite v15 only keeps the two backends' version numbers equal
PIPELINE_V15 = ""
