-- runner's SQL for SQLite, by name (runner.io.engine.queries).  Every name not starting
-- with "_" is defined with the same parameters in runner/io/postgres/queries.sql.
-- Sections follow the workloads; the operations that run these are in runner/io/engine/.

-- ==== figures (/metrics) ===========================================================

-- name: lead_counts
SELECT state, n FROM lead_counts

-- name: uncertain_count
SELECT coalesce((SELECT n FROM lead_counts WHERE state = 'uncertain'), 0)

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
       snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL,
       last_error, last_failure
FROM leads WHERE seq > :after_seq ORDER BY seq LIMIT :limit

-- name: record_page_in_state
-- the records in one state, in accept order (the index leads_by_state)
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL,
       last_error, last_failure
FROM leads WHERE state = :state AND seq > :after_seq ORDER BY state, seq LIMIT :limit

-- name: find_lead
SELECT seq, tenant_id, source_lead_id, write_id, state, attempts, reconcile_attempts,
       snapshot, last_polled_at, json_type(canonical, '$.contact_alias') IS NOT NULL,
       last_error, last_failure
FROM leads WHERE tenant_id = :tenant_id AND source_lead_id = :source_lead_id

-- name: lead_snapshot
SELECT state, snapshot FROM leads WHERE write_id = :write_id

-- counts by state and kind (JSON objects), the newest seq, the newest poll-health runs
-- and operator decisions (JSON arrays, newest first): one statement
-- name: store_summary
SELECT
  (SELECT json_group_object(state, n)
   FROM (SELECT state, n FROM lead_counts WHERE n > 0 ORDER BY state)),
  (SELECT json_group_object(kind, n)
   FROM (SELECT kind, n FROM outbox_counts WHERE n > 0 ORDER BY kind)),
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
   FROM (SELECT * FROM operator_decisions ORDER BY id DESC LIMIT :shown)),
  (SELECT json_object('waiting', count(*), 'next_attempt_at', min(next_attempt_at),
                      'rejected', (SELECT count(*) FROM leads
                                   WHERE state = 'failed_safe' AND last_error IS NOT NULL
                                     AND coalesce(last_failure, 'rejected') = 'rejected'))
   FROM leads WHERE state = 'failed_safe' AND next_attempt_at IS NOT NULL)

-- poll (runner.io.engine.observe): confirmed records, never polled first
-- the poll order index holds the confirmed records only (v19); named, as SQLite (no
-- statistics) would rather sort every confirmed record it finds by the state index
-- name: poll_page
SELECT seq, source_lead_id, write_id, snapshot FROM leads INDEXED BY leads_poll_order
WHERE state = 'confirmed' ORDER BY last_polled_at, seq LIMIT :limit

-- name: clamp_poll_times
UPDATE leads INDEXED BY leads_poll_order SET last_polled_at = :at
WHERE state = 'confirmed' AND last_polled_at > :at

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

-- every polled record's poll time, found by write_id: +state keeps the planner off the
-- state index (with it, every confirmed record was read for each page: 71-78 ms a page
-- of 100 at 100,000 confirmed)
-- name: observe_polled
UPDATE leads SET last_polled_at = :at
WHERE +state = 'confirmed' AND write_id IN (SELECT value FROM json_each(:write_ids))

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
       last_reconcile, last_reconcile_at, last_error, last_failure
FROM leads WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: resolve_subject
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts
FROM leads WHERE write_id = :write_id

-- name: record_operator_decision
INSERT INTO operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                readback, attempts, decided_at)
VALUES (:tenant_id, :source_lead_id, :write_id, :decision, :reason, :readback, :attempts,
        :at)

-- name: leave_uncertain
UPDATE leads SET state = :state, updated_at = :at, last_error = NULL, last_failure = NULL
WHERE write_id = :write_id AND state = 'uncertain' AND attempts = :attempts RETURNING seq

-- resolve --all: a page of uncertain records (with in_flight ones for a dry run, which
-- shows what recovery would make uncertain), in accept order; one ordered range of
-- leads_by_state (state, seq) per state, merged
-- name: resolve_page
SELECT seq, source_lead_id, write_id, state, canonical, tenant_id, attempts FROM (
    SELECT * FROM (SELECT seq, source_lead_id, write_id, state, canonical, tenant_id,
                          attempts
                   FROM leads WHERE state = 'uncertain' AND seq > :after_seq
                   ORDER BY seq LIMIT :limit)
    UNION ALL
    SELECT * FROM (SELECT seq, source_lead_id, write_id, state, canonical, tenant_id,
                          attempts
                   FROM leads WHERE :in_flight AND state = 'in_flight' AND seq > :after_seq
                   ORDER BY seq LIMIT :limit))
ORDER BY seq LIMIT :limit

-- resolve --all, one chunk's decisions (one transaction with leave_uncertain_many): a
-- decision row (its trigger writes the operator_resolved event) for every record of the
-- chunk still uncertain at the attempts it was read back at, in accept order.  The
-- attempts are taken by index (json_extract), as in finish_and_mark_batch
-- name: record_operator_decisions
INSERT INTO operator_decisions (tenant_id, source_lead_id, write_id, decision, reason,
                                readback, attempts, decided_at)
SELECT leads.tenant_id, leads.source_lead_id, leads.write_id, :decision, :reason,
       :readback, leads.attempts, :at
FROM json_each(:write_ids) AS d
JOIN leads ON leads.write_id = d.value
WHERE +leads.state = 'uncertain'  -- "+": by write_id
  AND leads.attempts = json_extract(:attempts, '$[' || d.key || ']')
ORDER BY leads.seq
RETURNING write_id

-- the move of the records just decided (their decision rows exist: the guard lets
-- uncertain -> failed_safe through only then), guarded by state and attempts
-- name: leave_uncertain_many
WITH s(write_id, attempts) AS MATERIALIZED (
    SELECT d.value, json_extract(:attempts, '$[' || d.key || ']') FROM json_each(:write_ids) AS d)
UPDATE leads SET state = :state, updated_at = :at, last_error = NULL, last_failure = NULL
FROM s
WHERE leads.write_id = s.write_id AND +leads.state = 'uncertain'
  AND leads.attempts = s.attempts
RETURNING leads.write_id

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


-- name: pinned_target
SELECT target_id FROM target_pin

-- name: pin_target
INSERT INTO target_pin (only_row, target_id, pinned_at) VALUES (1, :target_id, :now)
ON CONFLICT (only_row) DO NOTHING

-- name: recover_in_flight
UPDATE leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
                 last_failure = 'recovered'
WHERE state = 'in_flight' RETURNING source_lead_id

-- name: uncertain_page
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- the order of a reconcile pass (issue 16): oldest reconcile attempt first (never read
-- back in this uncertain episode first), then accept order; the pass's keys only
-- name: reconcile_order
SELECT seq FROM leads WHERE state = 'uncertain' AND last_failure IS NOT 'rewound'
ORDER BY last_reconcile_at, seq

-- the records of a reconcile chunk that are still uncertain (:seqs: JSON list)
-- name: uncertain_by_seqs
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND state = 'uncertain'

-- the states of the records with these write_ids (a JSON list): what a step whose answer
-- was lost left them in
-- name: lead_states
SELECT write_id, state FROM leads WHERE write_id IN (SELECT value FROM json_each(:write_ids))

-- prepared records, and failed_safe ones whose backoff is over (next_attempt_at, v12):
-- a record not due is not even read, so its retry writes nothing before it happens
-- name: dispatchable_page
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE state IN ('prepared', 'failed_safe') AND seq > :after_seq
  AND (next_attempt_at IS NULL OR next_attempt_at <= :now)
ORDER BY seq LIMIT :limit

-- name: finish_and_mark
-- one statement, so one commit, for both rows: the outcome of the send that finished
-- (:done, in_flight -> :outcome) and the in-flight mark of the next one (:next); either
-- may be NULL; each row is guarded by the state it must be in, and the triggers write
-- both state_changed events.  Also run by the blocking dispatch steps (delivery.py)
-- a failed_safe outcome waits until :retry_at (its backoff); every other change clears it
UPDATE leads SET
    state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END,
    attempts = attempts + (write_id IS :next), updated_at = :now,
    next_attempt_at = CASE WHEN write_id IS NOT :next AND :outcome = 'failed_safe'
                           THEN :retry_at END,
    last_error = CASE WHEN write_id IS NOT :next AND :outcome IN ('failed_safe', 'uncertain')
                      THEN :reason END,
    last_failure = CASE WHEN write_id IS NOT :next AND :outcome IN ('failed_safe', 'uncertain')
                        THEN :failure END
WHERE (write_id = :done AND state = 'in_flight')
   OR (write_id = :next AND state IN ('prepared', 'failed_safe'))
RETURNING write_id, attempts

-- finish_and_mark_batch's outcomes alone (:done[i] in_flight -> :outcomes[i]), with no
-- RETURNING rows: the blocking dispatch steps run it, then the mark of the next batch (the
-- batch step with no :done), in one transaction, so that only the marked rows come back
-- (each row back costs the commit's thread the interpreter, which the request's thread
-- and the page parse beside it hold); changes() says whether every record was in flight
-- name: _finish_batch
WITH s(write_id, outcome) AS MATERIALIZED (
    SELECT d.value, json_extract(:outcomes, '$[' || d.key || ']') FROM json_each(:done) AS d)
UPDATE leads SET
    state = s.outcome, updated_at = :now,
    next_attempt_at = CASE WHEN s.outcome = 'failed_safe' THEN :retry_at END,
    last_error = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :reason END,
    last_failure = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :failure END
FROM s
WHERE leads.write_id = s.write_id AND leads.state = 'in_flight'

-- name: finish_and_mark_batch
-- finish_and_mark for a batch (issue 16), one statement, so one commit: the outcomes of
-- the batch that finished (:done[i] in_flight -> :outcomes[i]) and the in-flight mark of
-- the next batch (:next, attempts + 1); lists are JSON text, either may be empty; each row
-- is guarded by the state it must be in.  Also run by the blocking dispatch steps.
-- :outcomes[i] is taken by index (json_extract, whose parse SQLite caches), not by a join
-- of two json_each scans (a nested loop: 100 x 100 for a batch of 100); MATERIALIZED
-- keeps the planner from flattening s into a scan of leads by state.
WITH s(write_id, outcome) AS MATERIALIZED (
    SELECT d.value, json_extract(:outcomes, '$[' || d.key || ']') FROM json_each(:done) AS d
    UNION ALL
    SELECT value, NULL FROM json_each(:next))
UPDATE leads SET
    state = coalesce(s.outcome, 'in_flight'),
    attempts = attempts + (s.outcome IS NULL), updated_at = :now,
    next_attempt_at = CASE WHEN s.outcome = 'failed_safe' THEN :retry_at END,
    last_error = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :reason END,
    last_failure = CASE WHEN s.outcome IN ('failed_safe', 'uncertain') THEN :failure END
FROM s
WHERE leads.write_id = s.write_id
  AND ((s.outcome IS NOT NULL AND leads.state = 'in_flight')
       OR (s.outcome IS NULL AND leads.state IN ('prepared', 'failed_safe')))
RETURNING write_id, attempts

-- name: record_reconcile
UPDATE leads SET reconcile_attempts = reconcile_attempts + 1,
    state = CASE WHEN :ok THEN 'confirmed' ELSE state END,
    last_error = CASE WHEN :ok THEN NULL ELSE last_error END,
    last_failure = CASE WHEN :ok THEN NULL ELSE last_failure END,
    reconcile_note = coalesce(:note, reconcile_note),
    last_reconcile = coalesce(:outcome, last_reconcile),
    last_reconcile_at = CASE WHEN :outcome IS NULL THEN last_reconcile_at ELSE :now END,
    updated_at = :now
WHERE write_id = :write_id AND state = 'uncertain' RETURNING seq

-- record_reconcile for a chunk read back in one request (issue 16), one statement: per
-- record (:write_ids[i]) its verdict (:outcomes[i], NULL: confirmed) and note (:notes[i]);
-- lists are JSON text; only records still uncertain change
-- name: record_reconcile_batch
UPDATE leads SET reconcile_attempts = reconcile_attempts + 1,
    state = CASE WHEN s.outcome IS NULL THEN 'confirmed' ELSE state END,
    last_error = CASE WHEN s.outcome IS NULL THEN NULL ELSE last_error END,
    last_failure = CASE WHEN s.outcome IS NULL THEN NULL ELSE last_failure END,
    reconcile_note = coalesce(s.note, reconcile_note),
    last_reconcile = coalesce(s.outcome, last_reconcile),
    last_reconcile_at = CASE WHEN s.outcome IS NULL THEN last_reconcile_at ELSE :now END,
    updated_at = :now
FROM (SELECT w.value AS write_id, o.value AS outcome, n.value AS note
      FROM json_each(:write_ids) AS w
      JOIN json_each(:outcomes) AS o ON o.key = w.key
      JOIN json_each(:notes) AS n ON n.key = w.key) AS s
WHERE leads.write_id = s.write_id AND +leads.state = 'uncertain'  -- "+": by write_id
RETURNING leads.write_id

-- a deduplicating target's uncertain records whose readback found no row (SPEC E7, v17):
-- each still uncertain is authorised for one resend at its current attempts (the
-- authorisation's trigger writes its outbox event), then queued again as failed_safe, due
-- at :retry_at; "+state": found by write_id
-- name: authorize_resends
INSERT INTO resend_authorizations (tenant_id, source_lead_id, write_id, target_id, attempts,
                                   readback, decided_at, evidence)
SELECT tenant_id, source_lead_id, write_id, :target_id, attempts, 'none', :now, :evidence
FROM leads WHERE write_id IN (SELECT value FROM json_each(:write_ids)) AND +state = 'uncertain'
ORDER BY seq
RETURNING write_id, attempts

-- name: requeue_authorized
UPDATE leads SET state = 'failed_safe', reconcile_attempts = reconcile_attempts + 1,
    last_reconcile = 'none', last_reconcile_at = :now, next_attempt_at = :retry_at,
    last_error = :reason, last_failure = 'requeued', updated_at = :now
WHERE write_id IN (SELECT value FROM json_each(:write_ids)) AND +state = 'uncertain'
RETURNING write_id

-- ==== the store's mark and its rewinds (v18, SPEC E8, issue 30) =====================

-- name: store_mark
SELECT store_id, epoch, counter, fenced_epoch, rewind, adopting, timeline, replication,
       key_check_until
FROM store_marks

-- the next batch's seq for a target that keeps marks: in the transaction that marks the
-- batch in flight (``mark_batch``)
-- name: next_batch_seq
UPDATE store_marks SET counter = counter + 1 RETURNING epoch, counter

-- a new epoch above both the store's and the target's (:min_epoch), counter 0, the fence
-- not yet raised at it; :reason: why (NULL: a rewind that is not pending any more)
-- name: begin_epoch
UPDATE store_marks SET epoch = max(epoch, :min_epoch) + 1, counter = 0, fenced_epoch = NULL,
    rewind = coalesce(:reason, rewind), updated_at = :now,
    key_check_until = CASE WHEN :reason IS NULL THEN key_check_until ELSE :until END
RETURNING store_id, epoch, counter, fenced_epoch, rewind, adopting, timeline, replication,
          key_check_until

-- every record the forgotten history could have sent becomes uncertain, tagged
-- ``rewound``: prepared and failed_safe ones through in_flight (attempts + 1), then every
-- in_flight one, then the uncertain ones are tagged (three statements, one transaction)
-- name: rewind_mark_sendable
UPDATE leads SET state = 'in_flight', attempts = attempts + 1, updated_at = :now,
    next_attempt_at = NULL, last_error = NULL, last_failure = NULL
WHERE state IN ('prepared', 'failed_safe')

-- name: rewind_tag
UPDATE leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
    last_failure = 'rewound'
WHERE state IN ('in_flight', 'uncertain')

-- records accepted after a rewind, before they are sent (SPEC E8): looked up by key
-- name: key_check_tag
UPDATE leads SET state = 'uncertain', updated_at = :now, last_error = :reason,
    last_failure = 'rewound'
WHERE state = 'in_flight'

-- name: key_check_pending
UPDATE store_marks SET rewind = coalesce(rewind, :reason), updated_at = :now

-- name: fence_raised
UPDATE store_marks SET fenced_epoch = epoch, adopting = NULL, updated_at = :now
WHERE epoch = :epoch RETURNING epoch

-- the rewound records still to read, in accept order
-- name: rewound_page
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE state = 'uncertain' AND last_failure = 'rewound' AND seq > :after_seq
ORDER BY seq LIMIT :limit

-- a rewound record's verdict other than confirmed and requeued: the tag goes (it is an
-- ordinary uncertain record from now on: reconcile only), its reason stays
-- name: rewound_untag
UPDATE leads SET last_failure = 'readback', reconcile_attempts = reconcile_attempts + 1,
    last_reconcile = :outcome, last_reconcile_at = :now, updated_at = :now
WHERE write_id = :write_id AND state = 'uncertain' AND last_failure = 'rewound'

-- name: rewind_done
UPDATE store_marks SET rewind = NULL, updated_at = :now
WHERE rewind IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM leads WHERE state = 'uncertain' AND last_failure = 'rewound')
RETURNING epoch

-- the server's timeline and the replication it ran under, recorded at each start under
-- the lock: a newer timeline later means a promoted standby (SPEC E8)
-- name: record_timeline
UPDATE store_marks SET timeline = :timeline, replication = :replication, updated_at = :now

-- a SQLite store has no server timeline
-- name: server_timeline
SELECT NULL

-- name: record_target_adoption
INSERT INTO target_adoptions (previous_owner, target_id, reason, decided_at)
VALUES (:previous_owner, :target_id, :reason, :now)

-- name: set_adopting
UPDATE store_marks SET adopting = :previous_owner, updated_at = :now

-- a rewound record found at the target under another write_id: the store takes it (the
-- kept adoption row lets the identity guard allow the change)
-- name: record_write_id_adoption
INSERT INTO write_id_adoptions (tenant_id, source_lead_id, write_id_was, write_id, decided_at)
SELECT tenant_id, source_lead_id, write_id, :write_id, :now FROM leads
WHERE write_id = :write_id_was AND state = 'uncertain'

-- name: adopt_write_id
UPDATE leads SET write_id = :write_id, updated_at = :now
WHERE write_id = :write_id_was AND state = 'uncertain' RETURNING seq

-- ==== (end delivery) ==================================================================


-- ==== candidates ====================================================================


-- name: candidate
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT json_group_array(analyst) FROM
           (SELECT analyst FROM candidate_analyses a WHERE a.candidate_id = c.id
            ORDER BY a.seq)) AS analysts
FROM candidates c
WHERE c.id = :id

-- name: candidates_page
SELECT c.seq, c.id, c.status, c.created_at, c.expires_at, c.analysis_deadline, c.quorum,
       c.promotion_locked_at, c.decision_id,
       (SELECT json_group_array(analyst) FROM
           (SELECT analyst FROM candidate_analyses a WHERE a.candidate_id = c.id
            ORDER BY a.seq)) AS analysts
FROM candidates c
WHERE c.seq > :after ORDER BY c.seq LIMIT :page

-- name: add_candidate
INSERT INTO candidates (id, created_at, expires_at, analysis_deadline, quorum, updated_at)
VALUES (:id, :created_at, :expires_at, :analysis_deadline, :quorum, :created_at)
ON CONFLICT (id) DO NOTHING
RETURNING seq

-- name: analyze_candidate
-- the analysis trigger counts it and moves discovered -> analyzing.  The status term is
-- spelled as candidates_schema.ACTIVE_TERM throughout (the expiry index's WHERE term)
INSERT INTO candidate_analyses (candidate_id, analyst, analyzed_at)
SELECT id, :analyst, :now FROM candidates
WHERE id = :id AND status IN ('analyzing', 'discovered') AND analysis_deadline >= :now
  AND created_at <= :now
ON CONFLICT (candidate_id, analyst) DO NOTHING
RETURNING seq

-- name: begin_promotion
-- with quorum, T4 cannot apply, so "unexpired" is exactly "not past expires_at" (T3)
UPDATE candidates
SET status = 'promoting', promotion_locked_at = :now, reason = 'promotion', updated_at = :now
WHERE id = :id AND status IN ('analyzing', 'discovered') AND analyses >= quorum
  AND expires_at >= :now AND created_at <= :now
RETURNING seq

-- name: record_decision
UPDATE candidates SET decision_id = :decision, reason = 'decision', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NULL
RETURNING seq

-- name: finish_promotion
UPDATE candidates SET status = 'promoted', reason = 'promoted', updated_at = :now
WHERE id = :id AND status = 'promoting' AND decision_id IS NOT NULL
RETURNING seq

-- name: expire_candidates
-- T3 (past expires_at) or T4 (past analysis_deadline without quorum).  Both imply
-- analysis_deadline < now (T2), the term the partial index candidates_to_expire serves
-- (its WHERE term spelled identically, so that SQLite uses it)
UPDATE candidates
SET status = 'expired',
    reason = CASE WHEN expires_at < :now THEN 'T3' ELSE 'T4' END,
    updated_at = :now
WHERE status IN ('analyzing', 'discovered') AND analysis_deadline < :now
  AND (expires_at < :now OR analyses < quorum)

-- name: reconcile_stuck_promoting
UPDATE candidates
SET status = CASE WHEN decision_id IS NOT NULL THEN 'promoted' ELSE 'rejected' END,
    reason = CASE WHEN decision_id IS NOT NULL THEN 'reconciled: decision recorded'
                  ELSE 'reconciled: no decision' END,
    updated_at = :now
WHERE status = 'promoting' AND promotion_locked_at < :cutoff

-- name: record_candidate_sweep
INSERT INTO candidate_sweep (one, function, at, result)
VALUES (1, :function, :at, :result)
ON CONFLICT (one) DO UPDATE
SET function = excluded.function, at = excluded.at, result = excluded.result

-- name: candidate_summary
-- the counts per status as one JSON object, and the last sweep (NULLs: none yet)
SELECT (SELECT json_group_object(status, n)
        FROM (SELECT status, count(*) AS n FROM candidates GROUP BY status) AS by_status
       ) AS counts,
       sweep.function, sweep.at, sweep.result
FROM (SELECT 1) AS one LEFT JOIN candidate_sweep AS sweep ON sweep.one = 1

-- ==== (end candidates) ================================================================


-- ==== pipeline ======================================================================


-- Staged processing (runner/io/engine/pipeline.py, SPEC P1-P11).  A claim is one
-- BEGIN IMMEDIATE transaction (its write lock keeps two claimers off the same rows):
-- a new fencing token from pipeline_fence, then one UPDATE … RETURNING through the
-- partial index that holds only non-terminal rows.  Every write that ends or extends a
-- claim names the token, the state 'claimed' and (but release) an unexpired lease.
-- A list parameter is JSON text here (read with json_each).

-- name: register_pipeline_processor
INSERT INTO pipeline_processors
    (name, version, stage, input_level, capability, rebacklog, registered_ms)
VALUES (:name, :version, :stage, :level, :capability, :rebacklog, :now)
ON CONFLICT (name, version) DO NOTHING
RETURNING name

-- name: current_pipeline_processors
-- every processor at its highest registered version
SELECT name, version, stage, capability, rebacklog FROM pipeline_processors p
WHERE NOT EXISTS (SELECT 1 FROM pipeline_processors q
                  WHERE q.name = p.name AND q.version > p.version)
ORDER BY input_level, name

-- name: sync_pipeline_backlog
-- the missing work rows of a processor version; :all_inputs also takes the inputs that
-- are terminal under an older version
INSERT INTO pipeline_work (input_id, processor, version, state, available_at, input_rev)
SELECT r.id, :name, :version, 'pending', :now, r.rev FROM pipeline_records r
WHERE r.level = :level
  AND (:all_inputs OR NOT EXISTS (SELECT 1 FROM pipeline_work o
                                  WHERE o.input_id = r.id AND o.processor = :name
                                    AND o.state = 'done'))
ON CONFLICT (input_id, processor, version) DO NOTHING

-- name: force_pipeline_replay
UPDATE pipeline_work SET state = 'pending', available_at = :now
WHERE processor = :name AND version = :version AND state = 'done'

-- name: pipeline_backlog
-- rows not terminal, plus inputs with no work row yet that sync_pipeline_backlog would take
SELECT (SELECT count(*) FROM pipeline_work
        WHERE processor = :name AND version = :version AND state <> 'done')
     + (SELECT count(*) FROM pipeline_records r
        WHERE r.level = :level
          AND NOT EXISTS (SELECT 1 FROM pipeline_work w WHERE w.input_id = r.id
                          AND w.processor = :name AND w.version = :version)
          AND (:all_inputs OR NOT EXISTS (SELECT 1 FROM pipeline_work o
                                          WHERE o.input_id = r.id AND o.processor = :name
                                            AND o.state = 'done')))

-- name: _next_pipeline_fence
UPDATE pipeline_fence SET last = last + 1 WHERE one = 1 RETURNING last

-- name: _claim_pipeline_work
-- claimable: pending and due, or claimed under a lease that ran out; an available_at
-- past :far was set by a clock that has since gone back, and is due too
UPDATE pipeline_work
SET state = 'claimed', owner = :owner, fence = :token, available_at = :expires,
    attempts = attempts + 1,
    input_rev = (SELECT r.rev FROM pipeline_records r WHERE r.id = pipeline_work.input_id)
WHERE id IN (SELECT id FROM pipeline_work
             WHERE processor = :name AND version = :version AND state <> 'done'
               AND (available_at <= :now OR available_at > :far)
             ORDER BY available_at LIMIT :limit)
RETURNING id

-- name: _claimed_pipeline_items
SELECT w.id, r.id, r.key, r.payload, w.input_rev, w.attempts
FROM pipeline_work w JOIN pipeline_records r ON r.id = w.input_id
WHERE w.fence = :token AND w.state = 'claimed'
ORDER BY w.id

-- name: held_pipeline_items
SELECT count(*) FROM pipeline_work
WHERE fence = :token AND state = 'claimed' AND available_at >= :now

-- name: renew_pipeline_lease
UPDATE pipeline_work SET available_at = :expires
WHERE fence = :token AND state = 'claimed' AND available_at >= :now

-- name: release_pipeline_claim
UPDATE pipeline_work SET state = 'pending', available_at = :now
WHERE fence = :token AND state = 'claimed'

-- name: finish_pipeline_work
-- an input that changed since the claim read it goes back to the backlog
UPDATE pipeline_work
SET state = CASE WHEN :state = 'done' AND input_rev IS NOT
                      (SELECT r.rev FROM pipeline_records r WHERE r.id = pipeline_work.input_id)
                 THEN 'pending' ELSE :state END,
    outcome = :outcome, error = :error, retryable = :retryable, available_at = :available,
    done_ms = :now
WHERE fence = :token AND state = 'claimed' AND id IN (SELECT value FROM json_each(:ids))

-- name: pipeline_records_by_key
SELECT key, payload, orders FROM pipeline_records
WHERE level = :level AND key IN (SELECT value FROM json_each(:keys))

-- name: replace_pipeline_records
-- one row per parameter set (execute_many); a new payload bumps rev (its trigger keeps
-- the old one in pipeline_history), the same payload and orders change nothing
INSERT INTO pipeline_records
    (level, key, payload, orders, processor, version, input_id, updated_ms)
VALUES (:level, :key, :payload, :orders, :name, :version, :input_id, :now)
ON CONFLICT (level, key) DO UPDATE
SET rev = rev + (payload IS NOT excluded.payload), payload = excluded.payload,
    orders = excluded.orders, processor = excluded.processor, version = excluded.version,
    input_id = excluded.input_id, updated_ms = excluded.updated_ms
WHERE payload IS NOT excluded.payload OR orders IS NOT excluded.orders

-- name: _ingest_pipeline_records
-- :rows is a JSON array of [key, payload] pairs: one statement, whose change count is
-- the number of new records (a known key is left as it is)
INSERT INTO pipeline_records (level, key, payload, processor, version, updated_ms)
SELECT 1, json_extract(value, '$[0]'), json_extract(value, '$[1]'), :name, :version, :now
FROM json_each(:rows) WHERE true
ON CONFLICT (level, key) DO NOTHING

-- name: move_pipeline_cursor
INSERT INTO pipeline_cursors (name, position, updated_ms) VALUES (:name, :position, :now)
ON CONFLICT (name) DO UPDATE
SET position = max(position, excluded.position), updated_ms = excluded.updated_ms

-- name: pipeline_cursor_position
SELECT position FROM pipeline_cursors WHERE name = :name

-- name: read_pipeline_outbox
-- the lead's form joins from its canonical event (one field, never the contact fields)
SELECT o.seq, o.kind, o.subject, o.payload, o.at, json_extract(l.canonical, '$.form_id')
FROM outbox o
LEFT JOIN leads l ON l.source_lead_id = o.subject
                 AND l.tenant_id = json_extract(o.payload, '$.tenant_id')
WHERE o.seq > :after AND o.seq <= :upto
ORDER BY o.seq LIMIT :limit

-- name: pipeline_outbox_floor
SELECT floor FROM outbox_retention

-- name: pipeline_outbox_last_seq
SELECT coalesce(max(seq), 0) FROM outbox

-- name: pipeline_outbox_pending
-- lead events of :kinds after :after that have no D1 record yet: how many, the first
SELECT count(*), min(o.seq) FROM outbox o
WHERE o.seq > :after AND o.kind IN (SELECT value FROM json_each(:kinds))
  AND NOT EXISTS (SELECT 1 FROM pipeline_records r
                  WHERE r.level = 1 AND r.key = 'outbox:' || o.seq)

-- name: pipeline_raw_pending
-- the same count from the kept counts (v14): the events of :kinds kept, less those ingested
SELECT (SELECT coalesce(sum(n), 0) FROM outbox_counts
        WHERE kind IN (SELECT value FROM json_each(:kinds)))
     - (SELECT coalesce(sum(n), 0) FROM outbox_ingested
        WHERE kind IN (SELECT value FROM json_each(:kinds)))

-- name: save_pipeline_worker_config
INSERT INTO pipeline_worker_config (worker, desired, effective, error, updated_at)
VALUES (:worker, :desired, :effective, :error, :at)
ON CONFLICT (worker) DO UPDATE
SET desired = excluded.desired, effective = excluded.effective, error = excluded.error,
    updated_at = excluded.updated_at

-- name: pipeline_worker_configs
SELECT worker, desired, effective, error, updated_at
FROM pipeline_worker_config ORDER BY worker

-- name: pipeline_level_counts
-- records per level, and (as level 0) the rows of pipeline_history
SELECT level, count(*) FROM pipeline_records GROUP BY level
UNION ALL
SELECT 0, count(*) FROM pipeline_history

-- name: pipeline_funnel
-- the funnel records of D4 (keys from :prefix up to, not including, :prefix_end)
SELECT json_extract(payload, '$.form_id'), json_extract(payload, '$.status'), count(*)
FROM pipeline_records
WHERE level = 4 AND key >= :prefix AND key < :prefix_end
  AND json_extract(payload, '$.counted') = 1
GROUP BY 1, 2 ORDER BY 1, 2

-- name: pipeline_level_page
SELECT key, payload, rev FROM pipeline_records
WHERE level = :level AND key > :after ORDER BY key LIMIT :limit

-- retention (schema v10, runner.pipeline.retention): one prune round, levels top down.
-- A candidate is finished and older than :before: not merged, not D4, read by some
-- processor (one is registered for its level), every work row on it done before
-- :before, in no current processor's backlog, no kept non-merged record made from it,
-- and at D1 its outbox event at or below the outbox floor
-- name: pipeline_prune_candidates
SELECT r.id FROM pipeline_records r
WHERE r.level = :level AND r.level < 4 AND r.orders IS NULL AND r.updated_ms < :before
  AND (r.level <> 1 OR (r.key GLOB 'outbox:[0-9]*'
                        AND CAST(substr(r.key, 8) AS INTEGER) <= :floor))
  AND NOT EXISTS (SELECT 1 FROM pipeline_work w
                  WHERE w.input_id = r.id
                    AND (w.state <> 'done' OR coalesce(w.done_ms, :before) >= :before))
  AND EXISTS (SELECT 1 FROM pipeline_processors p WHERE p.input_level = r.level)
  AND NOT EXISTS (SELECT 1 FROM pipeline_processors p
                  WHERE p.input_level = r.level
                    AND NOT EXISTS (SELECT 1 FROM pipeline_processors q
                                    WHERE q.name = p.name AND q.version > p.version)
                    AND NOT EXISTS (SELECT 1 FROM pipeline_work w
                                    WHERE w.input_id = r.id AND w.processor = p.name
                                      AND w.state = 'done'
                                      AND (w.version = p.version OR p.rebacklog = 0)))
  AND NOT EXISTS (SELECT 1 FROM pipeline_records c
                  WHERE c.input_id = r.id AND c.orders IS NULL AND c.level = r.level + 1)
ORDER BY r.id LIMIT :limit

-- name: prune_pipeline_outcome_history_of
DELETE FROM pipeline_outcome_history
WHERE work_id IN (SELECT id FROM pipeline_work
                  WHERE input_id IN (SELECT value FROM json_each(:ids)))

-- name: prune_pipeline_work_of
DELETE FROM pipeline_work WHERE input_id IN (SELECT value FROM json_each(:ids))

-- name: prune_pipeline_history_of
DELETE FROM pipeline_history WHERE record_id IN (SELECT value FROM json_each(:ids))

-- name: prune_pipeline_records
DELETE FROM pipeline_records WHERE id IN (SELECT value FROM json_each(:ids))

-- name: prune_old_pipeline_history
DELETE FROM pipeline_history
WHERE id IN (SELECT id FROM pipeline_history WHERE replaced_ms < :before
             ORDER BY id LIMIT :limit)

-- name: prune_old_pipeline_outcome_history
DELETE FROM pipeline_outcome_history
WHERE id IN (SELECT id FROM pipeline_outcome_history WHERE replaced_ms < :before
             ORDER BY id LIMIT :limit)

-- name: record_pipeline_prune
INSERT INTO pipeline_prunes (before_ms, removed, at) VALUES (:before, :removed, :at)

-- ==== (end pipeline) ==================================================================
