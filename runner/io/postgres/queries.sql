-- runner's SQL for PostgreSQL, by name (runner.io.engine.queries).  Every name not starting
-- with "_" is defined with the same parameters in runner/io/sqlite/queries.sql.
-- Tables are written {s}.name: the store's schema is put in when the file is loaded.
-- Sections follow the workloads; the operations that run these are in runner/io/engine/.

-- ==== figures (/metrics) ===========================================================

-- name: lead_counts
SELECT state, n FROM {s}.lead_counts

-- name: uncertain_count
SELECT coalesce((SELECT n FROM {s}.lead_counts WHERE state = 'uncertain'), 0)

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
       snapshot, last_polled_at, canonical::jsonb ? 'contact_alias', last_error,
       last_failure
FROM {s}.leads WHERE seq > :after_seq ORDER BY seq LIMIT :limit

-- name: record_page_in_state
-- the records in one state, in accept order (the index leads_by_state)
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, canonical::jsonb ? 'contact_alias', last_error,
       last_failure
FROM {s}.leads WHERE state = :state AND seq > :after_seq ORDER BY state, seq LIMIT :limit

-- name: find_lead
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, canonical::jsonb ? 'contact_alias', last_error,
       last_failure
FROM {s}.leads WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- name: lead_snapshot
SELECT state, snapshot FROM {s}.leads WHERE write_id = :write_id

-- counts by state and kind (JSON objects), the newest seq, the newest poll-health runs
-- and operator decisions (JSON arrays, newest first): one statement
-- name: store_summary
SELECT
  (SELECT coalesce(json_object_agg(state, n ORDER BY state), '{}')::text
   FROM {s}.lead_counts WHERE n > 0),
  (SELECT coalesce(json_object_agg(kind, n ORDER BY kind), '{}')::text
   FROM {s}.outbox_counts WHERE n > 0),
  (SELECT coalesce(max(seq), 0) FROM {s}.outbox),
  (SELECT coalesce(json_agg(runs ORDER BY runs.run DESC), '[]')::text
   FROM (SELECT run, failure, first_at AS since, last_at, passes, recovered_at,
                recovered_at IS NULL AS open
         FROM {s}.poll_health ORDER BY run DESC LIMIT :shown) AS runs),
  (SELECT coalesce(json_agg(d ORDER BY d.id DESC), '[]')::text
   FROM (SELECT id, source_lead_id, write_id, decision, reason, readback, attempts,
                decided_at AS at
         FROM {s}.operator_decisions ORDER BY id DESC LIMIT :shown) AS d),
  (SELECT json_build_object('waiting', count(*), 'next_attempt_at', min(next_attempt_at),
                            'rejected', (SELECT count(*) FROM {s}.leads
                                         WHERE state = 'failed_safe'
                                           AND last_error IS NOT NULL
                                           AND coalesce(last_failure, 'rejected')
                                               = 'rejected'))::text
   FROM {s}.leads WHERE state = 'failed_safe' AND next_attempt_at IS NOT NULL)

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
WHERE l.write_id = c.write_id AND coalesce(l.state, '') = 'confirmed'
  AND l.snapshot IS DISTINCT FROM c.snapshot
RETURNING l.seq

-- every polled record's poll time.  Here, in observe_changed and in observe_missing the
-- rows are found by write_id alone: coalesce() keeps the planner from also reading the
-- state index, which it took as selective without statistics and then read every
-- confirmed record's entry of (17 ms a page of 100 at 100,000 confirmed; 4.5 ms by
-- write_id, whatever the size; tests/test_query_plans.py)
-- name: observe_polled
UPDATE {s}.leads SET last_polled_at = :at
WHERE write_id = ANY(:write_ids::text[]) AND coalesce(state, '') = 'confirmed'

-- the records the target no longer has
-- name: observe_missing
UPDATE {s}.leads SET state = 'confirmed_then_missing', snapshot = :missing_snapshot,
                     snapshot_changed_at = :at, updated_at = :at
WHERE write_id = ANY(:write_ids::text[]) AND coalesce(state, '') = 'confirmed'

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
       last_reconcile, last_reconcile_at, last_error, last_failure
FROM {s}.leads WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: resolve_subject
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
FROM {s}.leads WHERE write_id = :write_id

-- name: record_operator_decision
INSERT INTO {s}.operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                    readback, attempts, decided_at)
VALUES (:tenant_id, :source_lead_id, :write_id, :decision, :reason, :readback, :attempts,
        :at)

-- name: leave_uncertain
UPDATE {s}.leads SET state = :state, updated_at = :at, last_error = NULL, last_failure = NULL
WHERE write_id = :write_id AND state = 'uncertain' AND attempts = :attempts RETURNING seq

-- resolve --all: a page of uncertain records (with in_flight ones for a dry run, which
-- shows what recovery would make uncertain), in accept order; one ordered range of
-- leads_by_state (state, seq) per state, merged
-- name: resolve_page
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts FROM (
    (SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
     FROM {s}.leads WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit)
    UNION ALL
    (SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
     FROM {s}.leads WHERE :in_flight::boolean AND state = 'in_flight' AND seq > :after_seq
     ORDER BY seq LIMIT :limit)) AS page
ORDER BY seq LIMIT :limit

-- resolve --all, one chunk's decisions (one transaction with leave_uncertain_many): a
-- decision row (its trigger writes the operator_resolved event) for every record of the
-- chunk still uncertain at the attempts it was read back at, in accept order; the
-- records' rows stay locked until the move commits
-- name: record_operator_decisions
INSERT INTO {s}.operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                    readback, attempts, decided_at)
SELECT l.tenant_id, l.source_lead_id, l.write_id, :decision::text, :reason::text,
       :readback::text, l.attempts, :at::text
FROM {s}.leads AS l
JOIN unnest(:write_ids::text[], :attempts::integer[]) AS d(write_id, attempts)
  ON l.write_id = d.write_id
WHERE l.write_id = ANY(:write_ids::text[]) AND coalesce(l.state, '') = 'uncertain'
  AND l.attempts = d.attempts
ORDER BY l.seq
FOR UPDATE OF l
RETURNING write_id

-- the move of the records just decided (their decision rows exist: the guard lets
-- uncertain -> failed_safe through only then), guarded by state and attempts
-- name: leave_uncertain_many
UPDATE {s}.leads AS l SET state = :state, updated_at = :at, last_error = NULL,
    last_failure = NULL
FROM unnest(:write_ids::text[], :attempts::integer[]) AS s(write_id, attempts)
WHERE l.write_id = s.write_id AND l.write_id = ANY(:write_ids::text[])
  AND coalesce(l.state, '') = 'uncertain' AND l.attempts = s.attempts
RETURNING l.write_id

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


-- name: pinned_target
SELECT target_id FROM {s}.target_pin

-- name: pin_target
INSERT INTO {s}.target_pin (target_id, pinned_at) VALUES (:target_id, :now)
ON CONFLICT (only_row) DO NOTHING

-- name: recover_in_flight
UPDATE {s}.leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
                     last_failure = 'recovered'
WHERE state = 'in_flight' RETURNING source_lead_id

-- name: uncertain_page
SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- the order of a reconcile pass (issue 16): oldest reconcile attempt first (never read
-- back in this uncertain episode first), then accept order; the pass's keys only
-- name: reconcile_order
SELECT seq FROM {s}.leads WHERE state = 'uncertain' AND last_failure IS DISTINCT FROM 'rewound'
ORDER BY last_reconcile_at NULLS FIRST, seq

-- the records of a reconcile chunk that are still uncertain
-- name: uncertain_by_seqs
SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
WHERE seq = ANY(:seqs::bigint[]) AND state = 'uncertain'

-- the states of the records with these write_ids: what a step whose answer was lost left
-- them in
-- name: lead_states
SELECT write_id, state FROM {s}.leads WHERE write_id = ANY(:write_ids::text[])

-- prepared records, and failed_safe ones whose backoff is over (next_attempt_at, v12):
-- a record not due is not even read, so its retry writes nothing before it happens
-- One ordered range of leads_by_state (state, seq) per state, merged: a single
-- ``state IN (...)`` read every sendable record and sorted them for each page when the
-- table had no statistics (the planner took the state test as selective), 52 ms a page
-- with a backlog of 100,000
-- name: dispatchable_page
SELECT seq, source_lead_id, write_id, state, canonical FROM (
    (SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
     WHERE state = 'prepared' AND seq > :after_seq ORDER BY seq LIMIT :limit)
    UNION ALL
    (SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
     WHERE state = 'failed_safe' AND seq > :after_seq
       AND (next_attempt_at IS NULL OR next_attempt_at <= :now::text)
     ORDER BY seq LIMIT :limit)) AS page
ORDER BY seq LIMIT :limit

-- name: finish_and_mark
-- one statement, so one commit, for both rows: the outcome of the send that finished
-- (:done, in_flight -> :outcome) and the in-flight mark of the next one (:next); either
-- may be NULL; each row is guarded by the state it must be in (the row lock an UPDATE
-- takes makes the check and the change one step, also against a concurrent writer), and
-- the triggers write both state_changed events
UPDATE {s}.leads SET
    state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END,
    attempts = attempts + CASE WHEN write_id = :next THEN 1 ELSE 0 END,
    updated_at = :now,
    next_attempt_at = CASE WHEN write_id IS DISTINCT FROM :next
                            AND :outcome = 'failed_safe' THEN :retry_at::text END,
    last_error = CASE WHEN write_id IS DISTINCT FROM :next
                       AND :outcome IN ('failed_safe', 'uncertain') THEN :reason::text END,
    last_failure = CASE WHEN write_id IS DISTINCT FROM :next
                         AND :outcome IN ('failed_safe', 'uncertain') THEN :failure::text END
WHERE (write_id = :done AND state = 'in_flight')
   OR (write_id = :next AND state IN ('prepared', 'failed_safe'))
RETURNING write_id, attempts

-- name: _finish_and_mark_fenced
-- finish_and_mark while this store holds the worker lock (runner.io.postgres.lock):
-- nothing at all changes once the lock's session (:pid, on the server instance started at
-- :started) no longer holds the advisory lock (:classid, :objid); the first column says
-- whether it did (one row at least)
WITH fence AS (
    SELECT pg_catalog.pg_postmaster_start_time() = :started::timestamptz AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.pid = :pid AND l.classid = :classid AND l.objid = :objid
          AND l.database = (SELECT oid FROM pg_catalog.pg_database
                            WHERE datname = current_database())) AS held
),
changed AS (
    UPDATE {s}.leads SET
        state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END,
        attempts = attempts + CASE WHEN write_id = :next THEN 1 ELSE 0 END,
        updated_at = :now,
        next_attempt_at = CASE WHEN write_id IS DISTINCT FROM :next
                                AND :outcome = 'failed_safe' THEN :retry_at::text END,
        last_error = CASE WHEN write_id IS DISTINCT FROM :next
                           AND :outcome IN ('failed_safe', 'uncertain') THEN :reason::text END,
        last_failure = CASE WHEN write_id IS DISTINCT FROM :next
                             AND :outcome IN ('failed_safe', 'uncertain') THEN :failure::text END
    WHERE (SELECT held FROM fence)
      AND ((write_id = :done AND state = 'in_flight')
           OR (write_id = :next AND state IN ('prepared', 'failed_safe')))
    RETURNING write_id, attempts
)
SELECT fence.held, changed.write_id, changed.attempts FROM fence LEFT JOIN changed ON true

-- name: finish_and_mark_batch
-- finish_and_mark for a batch (issue 16), one statement, so one commit: the outcomes of
-- the batch that finished (:done[i] in_flight -> :outcomes[i]) and the in-flight mark of
-- the next batch (:next, attempts + 1); either list may be empty; each row is guarded by
-- the state it must be in (under the row lock the UPDATE takes).  The rows are found by
-- write_id (ANY: the unique index), never by state: a state test the planner can use as an
-- index condition made it read every sendable record for each batch when the table had no
-- statistics (autovacuum off, or a fresh store), a cost that grew with the backlog
UPDATE {s}.leads AS l SET
    state = coalesce(s.outcome, 'in_flight'),
    attempts = l.attempts + CASE WHEN s.outcome IS NULL THEN 1 ELSE 0 END,
    updated_at = :now,
    next_attempt_at = CASE WHEN s.outcome = 'failed_safe' THEN :retry_at::text END,
    last_error = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :reason::text END,
    last_failure = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :failure::text END
FROM (SELECT d.write_id, d.outcome
      FROM unnest(:done::text[], :outcomes::text[]) AS d(write_id, outcome)
      UNION ALL
      SELECT n.write_id, NULL FROM unnest(:next::text[]) AS n(write_id)) AS s
WHERE l.write_id = s.write_id
  AND l.write_id = ANY(:done::text[] || :next::text[])
  AND CASE WHEN s.outcome IS NULL THEN l.state IN ('prepared', 'failed_safe')
           ELSE l.state = 'in_flight' END
RETURNING l.write_id, l.attempts

-- name: _fence_held
-- whether the lock's session (:pid, of the server instance started at :started) holds
-- the worker lock (:classid, :objid) as seen from this session: the fence of the two
-- statements below, asked alone (runner.io.postgres.lock: after a reconnect)
SELECT pg_catalog.pg_postmaster_start_time() = :started::timestamptz AND EXISTS (
    SELECT 1 FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.pid = :pid AND l.classid = :classid AND l.objid = :objid
      AND l.database = (SELECT oid FROM pg_catalog.pg_database
                        WHERE datname = current_database())) AS held

-- name: _finish_and_mark_batch_fenced
-- finish_and_mark_batch while this store holds the worker lock: nothing at all changes
-- once the lock's session (:pid) no longer holds the advisory lock (as
-- _finish_and_mark_fenced); the first column says whether it did (one row at least)
WITH fence AS (
    SELECT pg_catalog.pg_postmaster_start_time() = :started::timestamptz AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks k
        WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
          AND k.pid = :pid AND k.classid = :classid AND k.objid = :objid
          AND k.database = (SELECT oid FROM pg_catalog.pg_database
                            WHERE datname = current_database())) AS held
),
changed AS (
    UPDATE {s}.leads AS l SET
        state = coalesce(s.outcome, 'in_flight'),
        attempts = l.attempts + CASE WHEN s.outcome IS NULL THEN 1 ELSE 0 END,
        updated_at = :now,
        next_attempt_at = CASE WHEN s.outcome = 'failed_safe' THEN :retry_at::text END,
        last_error = CASE WHEN s.outcome IN ('failed_safe', 'uncertain')
                          THEN :reason::text END,
        last_failure = CASE WHEN s.outcome IN ('failed_safe', 'uncertain')
                            THEN :failure::text END
    FROM (SELECT d.write_id, d.outcome
          FROM unnest(:done::text[], :outcomes::text[]) AS d(write_id, outcome)
          UNION ALL
          SELECT n.write_id, NULL FROM unnest(:next::text[]) AS n(write_id)) AS s
    WHERE (SELECT held FROM fence)
      AND l.write_id = s.write_id
      AND l.write_id = ANY(:done::text[] || :next::text[])
      AND CASE WHEN s.outcome IS NULL THEN l.state IN ('prepared', 'failed_safe')
               ELSE l.state = 'in_flight' END
    RETURNING l.write_id, l.attempts
)
SELECT fence.held, changed.write_id, changed.attempts FROM fence LEFT JOIN changed ON true

-- name: record_reconcile
UPDATE {s}.leads SET reconcile_attempts = reconcile_attempts + 1,
    state = CASE WHEN :ok THEN 'confirmed' ELSE state END,
    last_error = CASE WHEN :ok THEN NULL ELSE last_error END,
    last_failure = CASE WHEN :ok THEN NULL ELSE last_failure END,
    reconcile_note = coalesce(:note, reconcile_note),
    last_reconcile = coalesce(:outcome::text, last_reconcile),
    last_reconcile_at = CASE WHEN :outcome::text IS NULL THEN last_reconcile_at ELSE :now END,
    updated_at = :now
WHERE write_id = :write_id AND state = 'uncertain' RETURNING seq

-- record_reconcile for a chunk read back in one request (issue 16), one statement: per
-- record (:write_ids[i]) its verdict (:outcomes[i], NULL: confirmed) and note (:notes[i]);
-- only records still uncertain change; found by write_id alone (coalesce: see
-- observe_polled; a fresh store's plan read every uncertain record for each row of s)
-- name: record_reconcile_batch
UPDATE {s}.leads AS l SET reconcile_attempts = l.reconcile_attempts + 1,
    state = CASE WHEN s.outcome IS NULL THEN 'confirmed' ELSE l.state END,
    last_error = CASE WHEN s.outcome IS NULL THEN NULL ELSE l.last_error END,
    last_failure = CASE WHEN s.outcome IS NULL THEN NULL ELSE l.last_failure END,
    reconcile_note = coalesce(s.note, l.reconcile_note),
    last_reconcile = coalesce(s.outcome, l.last_reconcile),
    last_reconcile_at = CASE WHEN s.outcome IS NULL THEN l.last_reconcile_at
                             ELSE :now::text END,
    updated_at = :now
FROM unnest(:write_ids::text[], :outcomes::text[], :notes::text[]) AS s(write_id, outcome, note)
WHERE l.write_id = s.write_id AND l.write_id = ANY(:write_ids::text[])
  AND coalesce(l.state, '') = 'uncertain'
RETURNING l.write_id

-- a deduplicating target's uncertain records whose readback found no row (SPEC E7, v17),
-- as on SQLite
-- name: authorize_resends
INSERT INTO {s}.resend_authorizations (tenant_id, source_lead_id, write_id, target_id,
                                       attempts, readback, decided_at, evidence)
SELECT tenant_id, source_lead_id, write_id, :target_id, attempts, 'none', :now, :evidence
FROM {s}.leads WHERE write_id = ANY(:write_ids::text[]) AND coalesce(state, '') = 'uncertain'
ORDER BY seq
RETURNING write_id, attempts

-- name: requeue_authorized
UPDATE {s}.leads SET state = 'failed_safe', reconcile_attempts = reconcile_attempts + 1,
    last_reconcile = 'none', last_reconcile_at = :now::text, next_attempt_at = :retry_at,
    last_error = :reason, last_failure = 'requeued', updated_at = :now
WHERE write_id = ANY(:write_ids::text[]) AND coalesce(state, '') = 'uncertain'
RETURNING write_id

-- ==== the store's mark and its rewinds (v18, SPEC E8, issue 30) =====================

-- name: store_mark
SELECT store_id, epoch, counter, fenced_epoch, rewind, adopting, timeline, replication,
       key_check_until
FROM {s}.store_marks

-- the next batch's seq for a target that keeps marks: in the transaction that marks the
-- batch in flight (``mark_batch``)
-- name: next_batch_seq
UPDATE {s}.store_marks SET counter = counter + 1 RETURNING epoch, counter

-- a new epoch above both the store's and the target's (:min_epoch), counter 0, the fence
-- not yet raised at it; :reason: why (NULL: a rewind that is not pending any more)
-- name: begin_epoch
UPDATE {s}.store_marks SET epoch = greatest(epoch, :min_epoch::bigint) + 1, counter = 0, fenced_epoch = NULL,
    rewind = coalesce(:reason, rewind), updated_at = :now,
    key_check_until = CASE WHEN :reason IS NULL THEN key_check_until ELSE :until END
RETURNING store_id, epoch, counter, fenced_epoch, rewind, adopting, timeline, replication,
          key_check_until

-- every record the forgotten history could have sent becomes uncertain, tagged
-- ``rewound``: prepared and failed_safe ones through in_flight (attempts + 1), then every
-- in_flight one, then the uncertain ones are tagged (three statements, one transaction)
-- name: rewind_mark_sendable
UPDATE {s}.leads SET state = 'in_flight', attempts = attempts + 1, updated_at = :now,
    next_attempt_at = NULL, last_error = NULL, last_failure = NULL
WHERE state IN ('prepared', 'failed_safe')

-- name: rewind_tag
UPDATE {s}.leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
    last_failure = 'rewound'
WHERE state IN ('in_flight', 'uncertain')

-- records accepted after a rewind, before they are sent (SPEC E8): looked up by key
-- name: key_check_tag
UPDATE {s}.leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
    last_failure = 'rewound'
WHERE state = 'in_flight'

-- name: key_check_pending
UPDATE {s}.store_marks SET rewind = coalesce(rewind, :reason), updated_at = :now

-- name: fence_raised
UPDATE {s}.store_marks SET fenced_epoch = epoch, adopting = NULL, updated_at = :now
WHERE epoch = :epoch RETURNING epoch

-- the rewound records still to read, in accept order
-- name: rewound_page
SELECT seq, source_lead_id, write_id, state, canonical FROM {s}.leads
WHERE state = 'uncertain' AND last_failure = 'rewound' AND seq > :after_seq
ORDER BY seq LIMIT :limit

-- a rewound record's verdict other than confirmed and requeued: the tag goes (it is an
-- ordinary uncertain record from now on: reconcile only), its reason stays
-- name: rewound_untag
UPDATE {s}.leads SET last_failure = 'readback', reconcile_attempts = reconcile_attempts + 1,
    last_reconcile = :outcome, last_reconcile_at = :now::text, updated_at = :now
WHERE write_id = :write_id AND state = 'uncertain' AND last_failure = 'rewound'

-- name: rewind_done
UPDATE {s}.store_marks SET rewind = NULL, updated_at = :now
WHERE rewind IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM {s}.leads WHERE state = 'uncertain' AND last_failure = 'rewound')
RETURNING epoch

-- the server's timeline and the replication it ran under, recorded at each start under
-- the lock: a newer timeline later means a promoted standby (SPEC E8)
-- name: record_timeline
UPDATE {s}.store_marks SET timeline = :timeline, replication = :replication, updated_at = :now

-- name: server_timeline
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint

-- name: record_target_adoption
INSERT INTO {s}.target_adoptions (previous_owner, target_id, reason, decided_at)
VALUES (:previous_owner, :target_id, :reason, :now)

-- name: set_adopting
UPDATE {s}.store_marks SET adopting = :previous_owner, updated_at = :now

-- a rewound record found at the target under another write_id: the store takes it (the
-- kept adoption row lets the identity guard allow the change)
-- name: record_write_id_adoption
INSERT INTO {s}.write_id_adoptions (tenant_id, source_lead_id, write_id_was, write_id, decided_at)
SELECT tenant_id, source_lead_id, write_id, :write_id, :now FROM {s}.leads
WHERE write_id = :write_id_was AND state = 'uncertain'

-- name: adopt_write_id
UPDATE {s}.leads SET write_id = :write_id, updated_at = :now
WHERE write_id = :write_id_was AND state = 'uncertain' RETURNING seq

-- ==== (end delivery) ==================================================================


-- ==== candidates ====================================================================


-- name: candidate
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT coalesce(json_agg(a.analyst ORDER BY a.seq), '[]')::text
        FROM {s}.candidate_analyses a WHERE a.candidate_id = c.id) AS analysts
FROM {s}.candidates c
WHERE c.id = :id

-- name: candidates_page
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT coalesce(json_agg(a.analyst ORDER BY a.seq), '[]')::text
        FROM {s}.candidate_analyses a WHERE a.candidate_id = c.id) AS analysts
FROM {s}.candidates c
WHERE c.seq > :after ORDER BY c.seq LIMIT :page

-- name: add_candidate
INSERT INTO {s}.candidates (id, created_at, expires_at, analysis_deadline, quorum, updated_at)
VALUES (:id, :created_at, :expires_at, :analysis_deadline, :quorum, :created_at)
ON CONFLICT (id) DO NOTHING
RETURNING seq

-- name: analyze_candidate
-- the analysis trigger counts it and moves discovered -> analyzing.  The status term is
-- candidates_schema.ACTIVE_TERM throughout (the expiry index's WHERE term)
INSERT INTO {s}.candidate_analyses (candidate_id, analyst, analyzed_at)
SELECT id, :analyst, :now FROM {s}.candidates
WHERE id = :id AND status IN ('analyzing', 'discovered') AND analysis_deadline >= :now
  AND created_at <= :now
ON CONFLICT (candidate_id, analyst) DO NOTHING
RETURNING seq

-- name: begin_promotion
-- with quorum, T4 cannot apply, so "unexpired" is exactly "not past expires_at" (T3)
UPDATE {s}.candidates
SET status = 'promoting', promotion_locked_at = :now, reason = 'promotion', updated_at = :now
WHERE id = :id AND status IN ('analyzing', 'discovered') AND analyses >= quorum
  AND expires_at >= :now AND created_at <= :now
RETURNING seq

-- name: record_decision
UPDATE {s}.candidates SET decision_id = :decision, reason = 'decision', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NULL
RETURNING seq

-- name: finish_promotion
UPDATE {s}.candidates SET status = 'promoted', reason = 'promoted', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NOT NULL
RETURNING seq

-- name: expire_candidates
-- T3 (past expires_at) or T4 (past analysis_deadline without quorum).  Both imply
-- analysis_deadline < now (T2), the term the partial index candidates_to_expire serves
UPDATE {s}.candidates
SET status = 'expired',
    reason = CASE WHEN expires_at < :now THEN 'T3' ELSE 'T4' END,
    updated_at = :now
WHERE status IN ('analyzing', 'discovered') AND analysis_deadline < :now
  AND (expires_at < :now OR analyses < quorum)

-- name: reconcile_stuck_promoting
UPDATE {s}.candidates
SET status = CASE WHEN decision_id IS NOT NULL THEN 'promoted' ELSE 'rejected' END,
    reason = CASE WHEN decision_id IS NOT NULL THEN 'reconciled: decision recorded'
                  ELSE 'reconciled: no decision' END,
    updated_at = :now
WHERE status = 'promoting' AND promotion_locked_at < :cutoff

-- name: record_candidate_sweep
INSERT INTO {s}.candidate_sweep (one, function, at, result)
VALUES (1, :function, :at, :result)
ON CONFLICT (one) DO UPDATE
SET function = excluded.function, at = excluded.at, result = excluded.result

-- name: candidate_summary
-- the counts per status as one JSON object, and the last sweep (NULLs: none yet)
SELECT (SELECT coalesce(json_object_agg(status, n), '{}')::text
        FROM (SELECT status, count(*) AS n FROM {s}.candidates GROUP BY status) AS by_status
       ) AS counts,
       sweep.function, sweep.at, sweep.result
FROM (SELECT 1) AS one LEFT JOIN {s}.candidate_sweep AS sweep ON sweep.one = 1

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

-- name: pipeline_raw_pending
-- the same count from the kept counts (v14): the events of :kinds kept, less those ingested
SELECT (SELECT coalesce(sum(n), 0) FROM {s}.outbox_counts WHERE kind = ANY(:kinds::text[]))
     - (SELECT coalesce(sum(n), 0) FROM {s}.outbox_ingested WHERE kind = ANY(:kinds::text[]))

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

-- retention (schema v10, runner.pipeline.retention): one prune round, levels top down,
-- as on SQLite; the round first holds record and work writers back until its commit
-- name: _lock_pipeline_for_prune
LOCK TABLE {s}.pipeline_records, {s}.pipeline_work IN SHARE ROW EXCLUSIVE MODE

-- name: _prune_without_jit
SET LOCAL jit = off

-- name: pipeline_prune_candidates
-- the level's unmerged records in id order (index pipeline_records_prunable, v15), each
-- checked by probes of its own work and outputs, so a round stops after :limit finds:
-- the two checks are scalar subqueries because as NOT EXISTS the planner turns them into
-- anti-joins that read the whole work index and every made-from entry once per round
-- (0.1-0.3 s a level at 386k rows, and more with dead rows); the round runs without JIT
-- (_prune_without_jit), whose compiling alone took 0.3 s of a 1 ms query of this shape
SELECT r.id FROM {s}.pipeline_records r
WHERE r.level = :level AND r.level < 4 AND r.orders IS NULL AND r.updated_ms < :before
  AND (r.level <> 1 OR CASE WHEN r.key ~ '^outbox:[0-9]{1,18}$'
                            THEN substr(r.key, 8)::bigint <= :floor
                            ELSE false END)
  AND (SELECT NOT EXISTS (SELECT 1 FROM {s}.pipeline_work w
                          WHERE w.input_id = r.id
                            AND (w.state <> 'done' OR coalesce(w.done_ms, :before) >= :before)))
  AND EXISTS (SELECT 1 FROM {s}.pipeline_processors p WHERE p.input_level = r.level)
  AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors p
                  WHERE p.input_level = r.level
                    AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_processors q
                                    WHERE q.name = p.name AND q.version > p.version)
                    AND NOT EXISTS (SELECT 1 FROM {s}.pipeline_work w
                                    WHERE w.input_id = r.id AND w.processor = p.name
                                      AND w.state = 'done'
                                      AND (w.version = p.version OR NOT p.rebacklog)))
  AND (SELECT NOT EXISTS (SELECT 1 FROM {s}.pipeline_records c
                          WHERE c.input_id = r.id AND c.orders IS NULL
                            AND c.level = r.level + 1))
ORDER BY r.id LIMIT :limit

-- name: prune_pipeline_outcome_history_of
DELETE FROM {s}.pipeline_outcome_history
WHERE work_id IN (SELECT id FROM {s}.pipeline_work WHERE input_id = ANY(:ids::bigint[]))

-- name: prune_pipeline_work_of
DELETE FROM {s}.pipeline_work WHERE input_id = ANY(:ids::bigint[])

-- name: prune_pipeline_history_of
DELETE FROM {s}.pipeline_history WHERE record_id = ANY(:ids::bigint[])

-- name: prune_pipeline_records
DELETE FROM {s}.pipeline_records WHERE id = ANY(:ids::bigint[])

-- name: prune_old_pipeline_history
DELETE FROM {s}.pipeline_history
WHERE id IN (SELECT id FROM {s}.pipeline_history WHERE replaced_ms < :before
             ORDER BY id LIMIT :limit)

-- name: prune_old_pipeline_outcome_history
DELETE FROM {s}.pipeline_outcome_history
WHERE id IN (SELECT id FROM {s}.pipeline_outcome_history WHERE replaced_ms < :before
             ORDER BY id LIMIT :limit)

-- name: record_pipeline_prune
INSERT INTO {s}.pipeline_prunes (before_ms, removed, at)
VALUES (:before, :removed::jsonb, :at)

-- ==== (end pipeline) ==================================================================


-- ==== replication (runner.replication: what is durable) =============================

-- the settings a commit runs under and the WAL senders this role sees (a plain role sees
-- each sender's application_name, and NULL for its state and sync_state)
-- name: _replication_facts
SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
       pg_catalog.pg_is_in_recovery(),
       (SELECT coalesce(json_agg(json_build_array(application_name, state, sync_state)),
                        '[]')::text
        FROM pg_catalog.pg_stat_replication)

-- the same without pg_stat_replication, for a role that may not read it
-- name: _replication_settings
SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
       pg_catalog.pg_is_in_recovery()

-- ==== (end replication) ===============================================================
