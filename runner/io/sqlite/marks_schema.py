"""SQLite schema v18: the store's mark, its rewinds, adopted targets and adopted write_ids
(SPEC E8, issue 30; ``runner.leads.marks`` says what a mark is, ``runner.tasks.rewind``
what a rewind does).

``store_marks`` (one row) holds the store's identity (``store_id``, random, made with the
row: an emptied or re-created store gets a new one) and its mark: the ``epoch`` and the
``counter`` of the last batch it marked for a target that keeps marks (every such batch
takes the next counter in the transaction that marks it in flight).  A rewind begins a
new epoch (counter 0) and tags every record that could have been sent by the history the
store forgot (``last_failure = 'rewound'``, each made uncertain: ``prepared`` and
``failed_safe`` ones through ``in_flight``, along edges the transition guard allows, with
``attempts + 1``: a send may have happened); ``fenced_epoch`` records that the target's
fence stands at the current epoch, raised after the tags committed and before any
readback, so that from then on a readback finding no row is conclusive for them.
``adopting`` is the previous owner an operator adopted (``runner target adopt``) whose
fence raise has not happened yet.  Every rewind writes one ``store_rewind`` outbox event
(an epoch begun at a plain start writes none).

``target_adoptions`` and ``write_id_adoptions`` are kept as written (UPDATE and DELETE
raise), each with its outbox event: an operator's decision that this store replaces the
target's previous owner, and a record found at the target under another write_id (sent
by the forgotten history: its key, its fields) whose write_id the store takes.  The
identity guard of ``leads`` lets a write_id change only with such a row.

``resend_authorizations`` gains ``evidence``: NULL for a deduplicating target (v17), or
``fence`` (the target's fence stood above every batch of the forgotten history when the
readback found no row).
"""

from __future__ import annotations

V18 = """
CREATE TABLE store_marks (
    only_row     INTEGER PRIMARY KEY CHECK (only_row = 1),
    store_id     TEXT NOT NULL CHECK (length(store_id) = 32),
    epoch        INTEGER NOT NULL CHECK (epoch >= 1),
    counter      INTEGER NOT NULL CHECK (counter >= 0 AND counter < 4294967296),
    fenced_epoch INTEGER,
    rewind       TEXT,
    adopting     TEXT,
    timeline     INTEGER,
    replication  TEXT,
    key_check_until TEXT,
    updated_at   TEXT
) STRICT;

INSERT INTO store_marks (only_row, store_id, epoch, counter)
VALUES (1, lower(hex(randomblob(16))), 1, 0);

CREATE TRIGGER store_marks_no_delete BEFORE DELETE ON store_marks
BEGIN SELECT RAISE(ABORT, 'the store mark is kept'); END;

CREATE TRIGGER store_marks_identity BEFORE UPDATE OF store_id ON store_marks
WHEN NEW.store_id IS NOT OLD.store_id
BEGIN SELECT RAISE(ABORT, 'a store''s identity never changes'); END;

CREATE TRIGGER store_marks_forward BEFORE UPDATE OF epoch, counter ON store_marks
WHEN NEW.epoch < OLD.epoch OR (NEW.epoch = OLD.epoch AND NEW.counter < OLD.counter)
BEGIN SELECT RAISE(ABORT, 'a store''s mark only moves forward'); END;

CREATE TRIGGER store_rewind AFTER UPDATE OF rewind ON store_marks
WHEN NEW.rewind IS NOT NULL AND OLD.rewind IS NULL
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('store_rewind', NEW.store_id,
            json_object('epoch', NEW.epoch, 'previous', OLD.epoch,
                        'previous_counter', OLD.counter, 'reason', NEW.rewind,
                        'adopting', NEW.adopting),
            coalesce(NEW.updated_at, strftime('%Y-%m-%dT%H:%M:%fZ')));
END;

CREATE TABLE target_adoptions (
    id             INTEGER PRIMARY KEY,
    previous_owner TEXT NOT NULL,
    target_id      TEXT,
    reason         TEXT NOT NULL CHECK (length(reason) > 0),
    decided_at     TEXT NOT NULL
) STRICT;

CREATE TRIGGER target_adoptions_no_update BEFORE UPDATE ON target_adoptions
BEGIN SELECT RAISE(ABORT, 'target adoptions are kept as recorded'); END;

CREATE TRIGGER target_adoptions_no_delete BEFORE DELETE ON target_adoptions
BEGIN SELECT RAISE(ABORT, 'target adoptions are kept as recorded'); END;

CREATE TRIGGER target_adopted AFTER INSERT ON target_adoptions
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('target_adopted', NEW.previous_owner,
            json_object('previous_owner', NEW.previous_owner, 'target_id', NEW.target_id,
                        'reason', NEW.reason),
            NEW.decided_at);
END;

CREATE TABLE write_id_adoptions (
    id             INTEGER PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    source_lead_id TEXT NOT NULL,
    write_id_was   TEXT NOT NULL,
    write_id       TEXT NOT NULL,
    decided_at     TEXT NOT NULL
) STRICT;

CREATE INDEX write_id_adoptions_by_record ON write_id_adoptions (write_id_was, write_id);

CREATE TRIGGER write_id_adoptions_no_update BEFORE UPDATE ON write_id_adoptions
BEGIN SELECT RAISE(ABORT, 'write_id adoptions are kept as recorded'); END;

CREATE TRIGGER write_id_adoptions_no_delete BEFORE DELETE ON write_id_adoptions
BEGIN SELECT RAISE(ABORT, 'write_id adoptions are kept as recorded'); END;

CREATE TRIGGER write_id_adopted AFTER INSERT ON write_id_adoptions
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('write_id_adopted', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id_was', NEW.write_id_was,
                        'write_id', NEW.write_id,
                        'reason', 'found at the target under this write_id, sent by a '
                                  || 'history the store forgot'),
            NEW.decided_at);
END;

DROP TRIGGER leads_identity_fixed;

CREATE TRIGGER leads_identity_fixed
BEFORE UPDATE OF tenant_id, source_lead_id, canonical, write_id, accepted_at ON leads
WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.source_lead_id IS NOT OLD.source_lead_id
  OR NEW.canonical IS NOT OLD.canonical OR NEW.accepted_at IS NOT OLD.accepted_at
  OR (NEW.write_id IS NOT OLD.write_id
      AND NOT EXISTS (SELECT 1 FROM write_id_adoptions a
                      WHERE a.write_id_was = OLD.write_id AND a.write_id = NEW.write_id))
BEGIN SELECT RAISE(ABORT, 'a lead record''s key, content and write_id never change'); END;

ALTER TABLE resend_authorizations ADD COLUMN evidence TEXT CHECK (evidence IN ('fence'));

DROP TRIGGER resend_authorized;

CREATE TRIGGER resend_authorized AFTER INSERT ON resend_authorizations
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('resend_authorized', NEW.source_lead_id,
            json_object('tenant_id', NEW.tenant_id, 'write_id', NEW.write_id,
                        'target_id', NEW.target_id, 'readback', NEW.readback,
                        'attempts', NEW.attempts,
                        'reason', CASE WHEN NEW.evidence = 'fence'
                            THEN 'the target''s fence stands above every batch the store '
                                 || 'forgot, and it holds no row'
                            ELSE 'the target deduplicates by write_id and holds no row' END),
            NEW.decided_at);
END;
"""
