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


-- ==== (end pipeline) ==================================================================
