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


-- ==== (end leads) =====================================================================


-- ==== delivery ======================================================================


-- ==== (end delivery) ==================================================================


-- ==== candidates ====================================================================


-- ==== (end candidates) ================================================================


-- ==== pipeline ======================================================================


-- Staged processing (runner/io/engine/pipeline.py, SPEC P1-P11).  A claim is one
-- statement: FOR UPDATE SKIP LOCKED picks the rows, so claimers on any number of hosts
-- never wait for each other nor take the same row (PostgreSQL re-checks the WHERE clause
-- against the latest version of a row it locks).  A completion locks the batch's rows
-- (FOR UPDATE) before it checks the lease, and writes records sorted by key, so two
-- completions never deadlock on records.  A list parameter is an array here.

-- name: register_pipeline_processor
INSERT INTO {s}.pipeline_processors
    (name, version, stage, input_level, capability, rebacklog, registered_ms)
VALUES (:name, :version, :stage, :level, :capability, :rebacklog, :now)
ON CONFLICT (name, version) DO NOTHING
RETURNING name

-- name: _lock_pipeline_records
-- waits for every transaction writing records, and holds new ones back until commit:
-- a record written meanwhile is seen by the sync or sees the new processor in its trigger
LOCK TABLE {s}.pipeline_records IN SHARE MODE

-- name: current_pipeline_processors
SELECT name, version, stage, capability, rebacklog FROM {s}.pipeline_processors p
WHERE NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors q
                  WHERE q.name = p.name AND q.version > p.version)
ORDER BY input_level, name

-- name: sync_pipeline_backlog
INSERT INTO {s}.pipeline_work (input_id, processor, version, state, available_at, input_rev)
SELECT r.id, :name, :version, 'pending', :now, r.rev FROM {s}.pipeline_records r
WHERE r.level = :level
  AND (:all_inputs OR NOT EXISTS (SELECT 1 FROM {s}.pipeline_work o
                                  WHERE o.input_id = r.id AND o.processor = :name
                                    AND o.state = 'done'))
ON CONFLICT (input_id, processor, version) DO NOTHING

-- name: force_pipeline_replay
UPDATE {s}.pipeline_work SET state = 'pending', available_at = :now
WHERE processor = :name AND version = :version AND state = 'done'

-- name: pipeline_backlog
SELECT (SELECT count(*) FROM {s}.pipeline_work
        WHERE processor = :name AND version = :version AND state <> 'done')
     + (SELECT count(*) FROM {s}.pipeline_records r
        WHERE r.level = :level
          AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_work w WHERE w.input_id = r.id
                          AND w.processor = :name AND w.version = :version)
          AND (:all_inputs OR NOT EXISTS (SELECT 1 FROM {s}.pipeline_work o
                                          WHERE o.input_id = r.id AND o.processor = :name
                                            AND o.state = 'done')))

-- name: _claim_pipeline_work
-- the picked rows, marked with a new fencing token, returned with their inputs
WITH picked AS (
    SELECT id FROM {s}.pipeline_work
    WHERE processor = :name AND version = :version AND state <> 'done'
      AND (available_at <= :now OR available_at > :far)
    ORDER BY available_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), token AS (
    SELECT nextval('{s}.pipeline_fence_seq') AS fence
)
UPDATE {s}.pipeline_work w
SET state = 'claimed', owner = :owner, fence = token.fence, available_at = :expires,
    attempts = w.attempts + 1, input_rev = r.rev
FROM picked, token, {s}.pipeline_records r
WHERE w.id = picked.id AND r.id = w.input_id
RETURNING w.id, w.input_id, r.key, r.payload, w.input_rev, w.attempts, w.fence

-- name: held_pipeline_items
SELECT count(*) FROM (SELECT 1 FROM {s}.pipeline_work
                      WHERE fence = :token AND state = 'claimed' AND available_at >= :now
                      FOR UPDATE) AS held

-- name: renew_pipeline_lease
UPDATE {s}.pipeline_work SET available_at = :expires
WHERE fence = :token AND state = 'claimed' AND available_at >= :now

-- name: release_pipeline_claim
UPDATE {s}.pipeline_work SET state = 'pending', available_at = :now
WHERE fence = :token AND state = 'claimed'

-- name: finish_pipeline_work
UPDATE {s}.pipeline_work w
SET state = CASE WHEN :state = 'done' AND w.input_rev IS DISTINCT FROM r.rev
                 THEN 'pending' ELSE :state END,
    outcome = :outcome, error = :error, retryable = :retryable, available_at = :available,
    done_ms = :now
FROM {s}.pipeline_records r
WHERE r.id = w.input_id AND w.fence = :token AND w.state = 'claimed'
  AND w.id = ANY(:ids::bigint[])

-- name: _lock_pipeline_keys
-- two merges of one record queue here instead of losing a field
SELECT pg_advisory_xact_lock(k) FROM unnest(:keys::bigint[]) AS k ORDER BY k

-- name: pipeline_records_by_key
SELECT key, payload, orders FROM {s}.pipeline_records
WHERE level = :level AND key = ANY(:keys::text[])

-- name: replace_pipeline_records
-- :key, :payload, :orders and :input_id are arrays: one statement for the batch
INSERT INTO {s}.pipeline_records AS p
    (level, key, payload, orders, processor, version, input_id, updated_ms)
SELECT :level, t.key, t.payload, t.orders, :name, :version, t.input_id, :now
FROM unnest(:key::text[], :payload::text[], :orders::text[], :input_id::bigint[])
     AS t(key, payload, orders, input_id)
ORDER BY t.key
ON CONFLICT (level, key) DO UPDATE
SET rev = p.rev + (p.payload IS DISTINCT FROM excluded.payload)::integer,
    payload = excluded.payload, orders = excluded.orders, processor = excluded.processor,
    version = excluded.version, input_id = excluded.input_id, updated_ms = excluded.updated_ms
WHERE p.payload IS DISTINCT FROM excluded.payload OR p.orders IS DISTINCT FROM excluded.orders

-- name: _ingest_pipeline_records
INSERT INTO {s}.pipeline_records (level, key, payload, processor, version, updated_ms)
SELECT 1, t.key, t.payload, :name, :version, :now
FROM unnest(:key::text[], :payload::text[]) AS t(key, payload)
ORDER BY t.key
ON CONFLICT (level, key) DO NOTHING

-- name: move_pipeline_cursor
INSERT INTO {s}.pipeline_cursors AS c (name, position, updated_ms)
VALUES (:name, :position, :now)
ON CONFLICT (name) DO UPDATE
SET position = GREATEST(c.position, excluded.position), updated_ms = excluded.updated_ms

-- name: pipeline_cursor_position
SELECT position FROM {s}.pipeline_cursors WHERE name = :name

-- name: read_pipeline_outbox
-- the outbox is tailed by its gap-free, commit-ordered sequence: a reader never skips an
-- event that commits late
SELECT o.seq, o.kind, o.subject, o.payload::text, o.at,
       (l.canonical::jsonb) ->> 'form_id'
FROM {s}.outbox o
LEFT JOIN {s}.leads l ON l.source_lead_id = o.subject
                     AND l.tenant_id = o.payload ->> 'tenant_id'
WHERE o.seq > :after AND o.seq <= :upto
ORDER BY o.seq LIMIT :limit

-- name: pipeline_outbox_floor
SELECT floor FROM {s}.outbox_retention

-- name: pipeline_outbox_last_seq
SELECT coalesce(max(seq), 0) FROM {s}.outbox

-- name: pipeline_outbox_pending
SELECT count(*), min(o.seq) FROM {s}.outbox o
WHERE o.seq > :after AND o.kind = ANY(:kinds::text[])
  AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)

-- name: save_pipeline_worker_config
INSERT INTO {s}.pipeline_worker_config (worker, desired, effective, error, updated_at)
VALUES (:worker, :desired, :effective, :error, :at)
ON CONFLICT (worker) DO UPDATE
SET desired = excluded.desired, effective = excluded.effective, error = excluded.error,
    updated_at = excluded.updated_at

-- name: pipeline_worker_configs
SELECT worker, desired, effective, error, updated_at
FROM {s}.pipeline_worker_config ORDER BY worker

-- name: pipeline_level_counts
SELECT level, count(*) FROM {s}.pipeline_records GROUP BY level
UNION ALL
SELECT 0, count(*) FROM {s}.pipeline_history

-- name: pipeline_funnel
SELECT payload::jsonb ->> 'form_id', payload::jsonb ->> 'status', count(*)
FROM {s}.pipeline_records
WHERE level = 4 AND key >= :prefix AND key < :prefix_end
  AND (payload::jsonb ->> 'counted')::boolean
GROUP BY 1, 2 ORDER BY 1, 2

-- name: pipeline_level_page
SELECT key, payload, rev FROM {s}.pipeline_records
WHERE level = :level AND key > :after ORDER BY key LIMIT :limit

-- ==== (end pipeline) ==================================================================
