"""SQLite schema v17: resends runner authorises itself on a deduplicating target (SPEC E7,
issue 29).

An uncertain record is sendable again only by evidence recorded in the store (v9: an
operator's ``not_sent`` decision).  v17 adds the second kind of evidence: a
``resend_authorizations`` row, written by runner in the reconcile pass when the store's
target declares that it deduplicates by ``write_id`` (and passed the conformance kit's
proof) and a fresh readback found no row.  Such a resend cannot make a second row: the
target keeps one row per ``write_id`` whatever arrives.  The row is kept as written
(UPDATE and DELETE raise) with one ``resend_authorized`` outbox event, and the guard of
``uncertain -> failed_safe`` now accepts either kind of evidence at the record's current
``attempts`` (one authorisation, one resend of one uncertain episode).

v17 also keeps the kind of a record's last failure, ``last_failure`` (one of
``runner.leads.port.FAILURES``: ``refused``, ``timed_out``, ``server_error``, ``dropped``,
``recovered``, …), beside its words in ``last_error`` (v13, which now holds the reason of
every failed_safe and uncertain outcome, not only a rejection), both set with the outcome
and cleared by every other state change: an operator can tell a refused connection from a
500 or a timeout (issue 29).
"""

from __future__ import annotations

V17 = """
ALTER TABLE leads ADD COLUMN last_failure TEXT;

CREATE TABLE resend_authorizations (
    id             INTEGER PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    source_lead_id TEXT NOT NULL,
    write_id       TEXT NOT NULL,
    target_id      TEXT,
    attempts       INTEGER NOT NULL,
    readback       TEXT NOT NULL CHECK (readback = 'none'),
    decided_at     TEXT NOT NULL
) STRICT;

CREATE INDEX resend_authorizations_by_record ON resend_authorizations (write_id, attempts);

CREATE TRIGGER resend_authorizations_no_update BEFORE UPDATE ON resend_authorizations
BEGIN SELECT RAISE(ABORT, 'resend authorizations are kept as recorded'); END;

CREATE TRIGGER resend_authorizations_no_delete BEFORE DELETE ON resend_authorizations
BEGIN SELECT RAISE(ABORT, 'resend authorizations are kept as recorded'); END;

CREATE TRIGGER resend_authorized AFTER INSERT ON resend_authorizations
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('resend_authorized', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'target_id', NEW.target_id, 'readback', NEW.readback,
                        'attempts', NEW.attempts,
                        'reason', 'the target deduplicates by write_id and holds no row'),
            NEW.decided_at);
END;

DROP TRIGGER leads_resend_needs_decision;

CREATE TRIGGER leads_resend_needs_decision BEFORE UPDATE OF state ON leads
WHEN OLD.state = 'uncertain' AND NEW.state = 'failed_safe'
 AND NOT EXISTS (SELECT 1 FROM operator_decisions d
                 WHERE d.write_id = NEW.write_id AND d.decision = 'not_sent'
                   AND d.attempts = OLD.attempts)
 AND NOT EXISTS (SELECT 1 FROM resend_authorizations r
                 WHERE r.write_id = NEW.write_id AND r.attempts = OLD.attempts)
BEGIN
    SELECT RAISE(ABORT,
        'illegal lead transition: uncertain -> failed_safe needs a recorded not-sent decision');
END;
"""
