-- runner's SQL for PostgreSQL, by name (runner.io.engine.queries).  Every name not starting
-- with "_" is defined with the same parameters in runner/io/sqlite/queries.sql.
-- Tables are written {s}.name: the store's schema is put in when the file is loaded.
-- Sections follow the workloads; the operations that run these are in runner/io/engine/.

-- ==== figures (/metrics) ===========================================================

-- name: lead_counts
SELECT state, n FROM {s}.lead_counts

-- name: oldest_uncertain_accepted_at
SELECT accepted_at FROM {s}.leads WHERE state = 'uncertain' ORDER BY seq LIMIT 1

-- name: open_poll_failure_since
SELECT first_at FROM {s}.poll_health WHERE recovered_at IS NULL ORDER BY run DESC LIMIT 1

-- ==== (end figures) ===================================================================


-- ==== leads: accept, status, records, poll, observe, operators, retention ===========


-- accept (runner.io.engine.leads): one statement, the new record or else the existing
-- one.  Under READ COMMITTED it cannot see a record that another transaction committed
-- while the insert waited for it: then no row, and one more read (accept_existing)
-- name: accept_lead
WITH inserted AS (
    INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id,
                           accepted_at, updated_at)
    VALUES (:tenant_id, :source_lead_id, :canonical, :write_id, :at, :at)
    ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
    RETURNING write_id
)
SELECT true, write_id, NULL::text FROM inserted
UNION ALL
SELECT false, write_id, canonical FROM {s}.leads
WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id
  AND NOT EXISTS (SELECT 1 FROM inserted)

-- name: accept_existing
SELECT false, write_id, canonical FROM {s}.leads
WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- the stored records of a group's keys (:keys, an n x 2 array of tenant_id, source_lead_id)
-- name: leads_by_keys
SELECT l.tenant_id, l.source_lead_id, l.canonical, l.write_id
FROM {s}.leads l
JOIN unnest((:keys::text[])[:][1:1], (:keys::text[])[:][2:2]) AS k(tenant_id, source_lead_id)
  ON l.tenant_id = k.tenant_id AND l.source_lead_id = k.source_lead_id

-- the bulk accept hook (runner.io.postgres.leads): a group in one statement (one
-- transaction, one commit), the rows in the group's order; a key that appears twice is
-- inserted once, first (ON CONFLICT DO NOTHING also skips a row that conflicts with one
-- the same statement inserted)
-- name: _insert_leads
INSERT INTO {s}.leads (tenant_id, source_lead_id, canonical, write_id, accepted_at,
                       updated_at)
SELECT tenant_id, source_lead_id, canonical, write_id, :at, :at
FROM unnest(:tenant_ids::text[], :source_lead_ids::text[], :canonicals::text[],
            :write_ids::text[]) WITH ORDINALITY
     AS item(tenant_id, source_lead_id, canonical, write_id, n)
ORDER BY n
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING write_id

-- records and status
-- name: record_page
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, canonical::jsonb ? 'contact_alias'
FROM {s}.leads WHERE seq > :after_seq ORDER BY seq LIMIT :limit

-- name: find_lead
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, canonical::jsonb ? 'contact_alias'
FROM {s}.leads WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- name: lead_snapshot
SELECT state, snapshot FROM {s}.leads WHERE write_id = :write_id

-- counts by state and kind (JSON objects), the newest seq, the newest poll-health runs
-- and operator decisions (JSON arrays, newest first): one statement
-- name: store_summary
SELECT
  (SELECT coalesce(json_object_agg(state, n ORDER BY state), '{}')::text
   FROM (SELECT state, count(*) AS n FROM {s}.leads GROUP BY state) AS by_state),
  (SELECT coalesce(json_object_agg(kind, n ORDER BY kind), '{}')::text
   FROM (SELECT kind, count(*) AS n FROM {s}.outbox GROUP BY kind) AS by_kind),
  (SELECT coalesce(max(seq), 0) FROM {s}.outbox),
  (SELECT coalesce(json_agg(runs ORDER BY runs.run DESC), '[]')::text
   FROM (SELECT run, failure, first_at AS since, last_at, passes, recovered_at,
                recovered_at IS NULL AS open
         FROM {s}.poll_health ORDER BY run DESC LIMIT :shown) AS runs),
  (SELECT coalesce(json_agg(d ORDER BY d.id DESC), '[]')::text
   FROM (SELECT id, source_lead_id, write_id, decision, reason, readback, attempts,
                decided_at AS at
         FROM {s}.operator_decisions ORDER BY id DESC LIMIT :shown) AS d)

-- poll (runner.io.engine.observe): confirmed records, never polled first
-- name: poll_page
SELECT seq, source_lead_id, write_id, snapshot FROM {s}.leads
WHERE state = 'confirmed' ORDER BY last_polled_at NULLS FIRST, seq LIMIT :limit

-- name: clamp_poll_times
UPDATE {s}.leads SET last_polled_at = :at WHERE state = 'confirmed' AND last_polled_at > :at

-- :changes is an n x 2 array of write_id, snapshot; IS DISTINCT FROM is re-checked against
-- the latest row version when another poller got there first, so a change counts once
-- name: observe_changed
UPDATE {s}.leads AS l SET snapshot = c.snapshot, snapshot_changed_at = :at, updated_at = :at
FROM unnest((:changes::text[])[:][1:1], (:changes::text[])[:][2:2]) AS c(write_id, snapshot)
WHERE l.write_id = c.write_id AND l.state = 'confirmed'
  AND l.snapshot IS DISTINCT FROM c.snapshot
RETURNING l.seq

-- every polled record's poll time
-- name: observe_polled
UPDATE {s}.leads SET last_polled_at = :at
WHERE state = 'confirmed' AND write_id = ANY(:write_ids::text[])

-- the records the target no longer has
-- name: observe_missing
UPDATE {s}.leads SET state = 'confirmed_then_missing', snapshot = :missing_snapshot,
                     snapshot_changed_at = :at, updated_at = :at
WHERE state = 'confirmed' AND write_id = ANY(:write_ids::text[])

-- poll-health runs are shared by every process of the store: a pass takes this
-- transaction lock (keyed by the schema) before it looks at the open run, so two pollers
-- that fail at once open one run and write one event
-- name: _lock_poll_health
SELECT pg_advisory_xact_lock(:key)

-- name: open_poll_run
SELECT run, failure FROM {s}.poll_health WHERE recovered_at IS NULL
ORDER BY run DESC LIMIT 1

-- name: extend_poll_run
UPDATE {s}.poll_health SET last_at = :at, passes = passes + 1 WHERE run = :run

-- name: close_poll_run
UPDATE {s}.poll_health SET recovered_at = :at WHERE run = :run

-- name: start_poll_run
INSERT INTO {s}.poll_health (failure, first_at, last_at) VALUES (:failure, :at, :at)

-- operators (runner.io.engine.operators)
-- name: uncertain_records
SELECT seq, source_lead_id, write_id, attempts, reconcile_attempts, uncertain_since,
       last_reconcile, last_reconcile_at
FROM {s}.leads WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: resolve_subject
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
FROM {s}.leads WHERE write_id = :write_id

-- name: record_decision
INSERT INTO {s}.operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                    readback, attempts, decided_at)
VALUES (:tenant_id, :source_lead_id, :write_id, :decision, :reason, :readback, :attempts,
        :at)

-- name: leave_uncertain
UPDATE {s}.leads SET state = :state, updated_at = :at
WHERE write_id = :write_id AND state = 'uncertain' AND attempts = :attempts RETURNING seq

-- retention (runner.io.engine.retention, schema v7)
-- name: outbox_floor
SELECT floor FROM {s}.outbox_retention

-- name: export_outbox
SELECT seq, kind, subject, payload::text, at FROM {s}.outbox WHERE seq > :after_seq
ORDER BY seq LIMIT :limit

-- name: retention_head
SELECT floor, export_watermark FROM {s}.outbox_retention

-- name: outbox_prunes
SELECT removed, by_kind::text FROM {s}.outbox_prunes

-- name: advance_export_watermark
UPDATE {s}.outbox_retention
SET export_watermark = GREATEST(coalesce(export_watermark, 0), :seq), updated_at = :at

-- name: export_watermark
SELECT export_watermark FROM {s}.outbox_retention

-- inside the prune's transaction, locking the retention row (prunes and watermark
-- updates queue on it): the floor, the watermark, the raw retriever's cursor and the
-- newest event
-- name: prune_facts
SELECT r.floor, r.export_watermark,
       coalesce((SELECT position FROM {s}.pipeline_cursors WHERE name = :cursor), 0),
       (SELECT last_seq FROM {s}.outbox_counter)
FROM {s}.outbox_retention r FOR UPDATE

-- name: first_uningested
SELECT min(o.seq) FROM {s}.outbox o
WHERE o.seq > :floor AND o.seq <= :cursor AND o.kind = ANY(:kinds::text[])
  AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)

-- name: outbox_kinds_between
SELECT kind, count(*) FROM {s}.outbox WHERE seq > :after_seq AND seq <= :upto
GROUP BY kind ORDER BY kind

-- name: set_outbox_floor
UPDATE {s}.outbox_retention SET floor = :floor, updated_at = :at

-- name: delete_outbox_upto
DELETE FROM {s}.outbox WHERE seq <= :floor

-- name: record_prune
INSERT INTO {s}.outbox_prunes (from_floor, to_floor, removed, by_kind, limited_by, at)
VALUES (:from_floor, :to_floor, :removed, :by_kind::jsonb, :limited_by, :at)

-- ==== (end leads) =====================================================================


-- ==== delivery ======================================================================


-- ==== (end delivery) ==================================================================


-- ==== candidates ====================================================================


-- ==== (end candidates) ================================================================


-- ==== pipeline ======================================================================


-- ==== (end pipeline) ==================================================================
