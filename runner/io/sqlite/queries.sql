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


-- ==== (end leads) =====================================================================


-- ==== delivery ======================================================================


-- name: pinned_target
SELECT target_id FROM target_pin

-- name: pin_target
INSERT INTO target_pin (only_row, target_id, pinned_at) VALUES (1, :target_id, :now)
ON CONFLICT (only_row) DO NOTHING

-- name: recover_in_flight
UPDATE leads SET state = 'uncertain', updated_at = :now
WHERE state = 'in_flight' RETURNING source_lead_id

-- name: uncertain_page
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE state = 'uncertain' AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: dispatchable_page
SELECT seq, source_lead_id, write_id, state, canonical FROM leads
WHERE state IN ('prepared', 'failed_safe') AND seq > :after_seq ORDER BY seq LIMIT :limit

-- name: finish_and_mark
-- one statement, so one commit, for both rows: the outcome of the send that finished
-- (:done, in_flight -> :outcome) and the in-flight mark of the next one (:next); either
-- may be NULL; each row is guarded by the state it must be in, and the triggers write
-- both state_changed events.  Also run by the blocking dispatch steps (delivery.py)
UPDATE leads SET
    state = CASE WHEN write_id = :next THEN 'in_flight' ELSE :outcome END,
    attempts = attempts + (write_id IS :next), updated_at = :now
WHERE (write_id = :done AND state = 'in_flight')
   OR (write_id = :next AND state IN ('prepared', 'failed_safe'))
RETURNING write_id, attempts

-- name: record_reconcile
UPDATE leads SET reconcile_attempts = reconcile_attempts + 1,
    state = CASE WHEN :ok THEN 'confirmed' ELSE state END,
    reconcile_note = coalesce(:note, reconcile_note),
    last_reconcile = coalesce(:outcome, last_reconcile),
    last_reconcile_at = CASE WHEN :outcome IS NULL THEN last_reconcile_at ELSE :now END,
    updated_at = :now
WHERE write_id = :write_id AND state = 'uncertain' RETURNING seq

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


-- ==== (end pipeline) ==================================================================
