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


-- ==== (end candidates) ================================================================


-- ==== pipeline ======================================================================


-- ==== (end pipeline) ==================================================================
