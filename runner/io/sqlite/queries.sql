-- runner's SQL for SQLite, by name (runner.io.engine.queries).  Every name not starting
-- with "_" is defined with the same parameters in runner/io/postgres/queries.sql.
-- Sections follow the workloads; the operations that run these are in runner/io/engine/.

-- ==== figures (/metrics) ===========================================================

-- name: lead_counts
SELECT state, n FROM lead_counts

-- name: oldest_uncertain_accepted_at
SELECT accepted_at FROM leads WHERE state = 'uncertain' ORDER BY seq LIMIT 1

-- name: open_poll_failure_since
SELECT first_at FROM poll_health WHERE recovered_at IS NULL ORDER BY run DESC LIMIT 1

-- ==== (end figures) ===================================================================


-- ==== leads: accept, status, records, poll, observe, operators, retention ===========


-- accept (runner.io.engine.leads): one record, its new write_id from RETURNING; a
-- duplicate key returns no row and costs one more read (accept_existing)
-- name: accept_lead
INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, updated_at)
VALUES (:tenant_id, :source_lead_id, :canonical, :write_id, :at, :at)
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING 1, write_id, NULL

-- name: accept_existing
SELECT 0, write_id, canonical FROM leads
WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- the stored records of a group's keys (:keys, a JSON array of [tenant_id, source_lead_id])
-- name: leads_by_keys
SELECT l.tenant_id, l.source_lead_id, l.canonical, l.write_id
FROM json_each(:keys) AS k
JOIN leads AS l ON l.tenant_id = json_extract(k.value, '$[0]')
               AND l.source_lead_id = json_extract(k.value, '$[1]')

-- the bulk accept hook (runner.io.sqlite.leads): the VALUES row is repeated once per
-- record, one statement per group; SQLite applies the rows in order, so a key that
-- appears twice in a group is inserted once, first
-- name: _insert_leads_returning
INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING
RETURNING write_id

-- name: _insert_leads
INSERT INTO leads (tenant_id, source_lead_id, canonical, write_id, accepted_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant_id, source_lead_id) DO NOTHING

-- name: _changes
SELECT changes()

-- name: _inserted_write_ids
SELECT write_id FROM leads WHERE write_id IN (SELECT value FROM json_each(:write_ids))

-- records and status
-- name: record_page
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL
FROM leads WHERE seq > :after_seq ORDER BY seq LIMIT :limit

-- name: find_lead
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL
FROM leads WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- name: lead_snapshot
SELECT state, snapshot FROM leads WHERE write_id = :write_id

-- counts by state and kind (JSON objects), the newest seq, the newest poll-health runs
-- and operator decisions (JSON arrays, newest first): one statement
-- name: store_summary
SELECT
  (SELECT json_group_object(state, n)
   FROM (SELECT state, count(*) AS n FROM leads GROUP BY state ORDER BY state)),
  (SELECT json_group_object(kind, n)
   FROM (SELECT kind, count(*) AS n FROM outbox GROUP BY kind ORDER BY kind)),
  (SELECT coalesce(max(seq), 0) FROM outbox),
  (SELECT json_group_array(json_object(
            'run', run, 'failure', failure, 'since', first_at, 'last_at', last_at,
            'passes', passes, 'recovered_at', recovered_at,
            'open', json(CASE WHEN recovered_at IS NULL THEN 'true' ELSE 'false' END)))
   FROM (SELECT * FROM poll_health ORDER BY run DESC LIMIT :shown)),
  (SELECT json_group_array(json_object(
            'id', id, 'source_lead_id', source_lead_id, 'write_id', write_id,
            'decision', decision, 'reason', reason, 'readback', readback,
            'attempts', attempts, 'at', decided_at))
   FROM (SELECT * FROM operator_decisions ORDER BY id DESC LIMIT :shown))

-- poll (runner.io.engine.observe): confirmed records, never polled first
-- name: poll_page
SELECT seq, source_lead_id, write_id, snapshot FROM leads
WHERE state = 'confirmed' ORDER BY last_polled_at, seq LIMIT :limit

-- name: clamp_poll_times
UPDATE leads SET last_polled_at = :at WHERE state = 'confirmed' AND last_polled_at > :at

-- :changes is a JSON array of [write_id, snapshot]; a row for each snapshot that differs.
-- +state keeps SQLite (no statistics) from walking every confirmed record by the state
-- index, each against the whole list: it looks the changed ones up by write_id instead
-- name: observe_changed
UPDATE leads SET snapshot = json_extract(c.value, '$[1]'), snapshot_changed_at = :at,
                 updated_at = :at
FROM json_each(:changes) AS c
WHERE leads.write_id = json_extract(c.value, '$[0]') AND +leads.state = 'confirmed'
  AND leads.snapshot IS NOT json_extract(c.value, '$[1]')
RETURNING seq

-- every polled record's poll time
-- name: observe_polled
UPDATE leads SET last_polled_at = :at
WHERE state = 'confirmed' AND write_id IN (SELECT value FROM json_each(:write_ids))

-- the records the target no longer has (by write_id, as above)
-- name: observe_missing
UPDATE leads SET state = 'confirmed_then_missing', snapshot = :missing_snapshot,
                 snapshot_changed_at = :at, updated_at = :at
WHERE +state = 'confirmed' AND write_id IN (SELECT value FROM json_each(:write_ids))

-- name: open_poll_run
SELECT run, failure FROM poll_health WHERE recovered_at IS NULL ORDER BY run DESC LIMIT 1

-- name: extend_poll_run
UPDATE poll_health SET last_at = :at, passes = passes + 1 WHERE run = :run

-- name: close_poll_run
UPDATE poll_health SET recovered_at = :at WHERE run = :run

-- name: start_poll_run
INSERT INTO poll_health (failure, first_at, last_at) VALUES (:failure, :at, :at)

-- operators (runner.io.engine.operators)
-- name: uncertain_records
SELECT seq, source_lead_id, write_id, attempts, reconcile_attempts, uncertain_since,
       last_reconcile, last_reconcile_at
FROM leads WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: resolve_subject
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
FROM leads WHERE write_id = :write_id

-- name: record_decision
INSERT INTO operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                readback, attempts, decided_at)
VALUES (:tenant_id, :source_lead_id, :write_id, :decision, :reason, :readback, :attempts,
        :at)

-- name: leave_uncertain
UPDATE leads SET state = :state, updated_at = :at
WHERE write_id = :write_id AND state = 'uncertain' AND attempts = :attempts RETURNING seq

-- retention (runner.io.engine.retention, schema v7)
-- name: outbox_floor
SELECT floor FROM outbox_retention

-- name: export_outbox
SELECT seq, kind, subject, payload, at FROM outbox WHERE seq > :after_seq ORDER BY seq
LIMIT :limit

-- name: retention_head
SELECT floor, export_watermark FROM outbox_retention

-- name: outbox_prunes
SELECT removed, by_kind FROM outbox_prunes

-- name: advance_export_watermark
UPDATE outbox_retention SET export_watermark = max(coalesce(export_watermark, 0), :seq),
                            updated_at = :at

-- name: export_watermark
SELECT export_watermark FROM outbox_retention

-- inside the prune's BEGIN IMMEDIATE: the floor, the watermark, the raw retriever's cursor
-- and the newest event
-- name: prune_facts
SELECT r.floor, r.export_watermark,
       coalesce((SELECT position FROM pipeline_cursors WHERE name = :cursor), 0),
       (SELECT coalesce(max(seq), 0) FROM outbox)
FROM outbox_retention r

-- name: first_uningested
SELECT min(o.seq) FROM outbox o
WHERE o.seq > :floor AND o.seq <= :cursor
  AND o.kind IN (SELECT value FROM json_each(:kinds))
  AND NOT EXISTS (SELECT 1 FROM pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)

-- name: outbox_kinds_between
SELECT kind, count(*) FROM outbox WHERE seq > :after_seq AND seq <= :upto
GROUP BY kind ORDER BY kind

-- name: set_outbox_floor
UPDATE outbox_retention SET floor = :floor, updated_at = :at

-- name: delete_outbox_upto
DELETE FROM outbox WHERE seq <= :floor

-- name: record_prune
INSERT INTO outbox_prunes (from_floor, to_floor, removed, by_kind, limited_by, at)
VALUES (:from_floor, :to_floor, :removed, :by_kind, :limited_by, :at)

-- ==== (end leads) =====================================================================


-- ==== delivery ======================================================================


-- ==== (end delivery) ==================================================================


-- ==== candidates ====================================================================


-- ==== (end candidates) ================================================================


-- ==== pipeline ======================================================================


-- ==== (end pipeline) ==================================================================
