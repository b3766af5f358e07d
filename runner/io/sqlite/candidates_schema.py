"""SQLite DDL for the candidate lifecycle (SPEC C1, C2, K3), one migration of its own.

As for leads, the schema enforces the invariants itself, so a hand-written query cannot
break them either:

* a candidate is born ``discovered`` with no analyses, no lock and no decision, and its
  id, times and quorum never change; T2 (``analysis_deadline <= expires_at``) is a CHECK;
* candidates and analyses are never deleted (T5, T6); promoted, rejected and expired rows
  never change at all;
* a status change outside ``runner.candidates.states.TRANSITIONS`` raises;
* ``analyses`` always equals the number of rows in ``candidate_analyses`` (one per
  distinct analyst), and promoting or promoted needs quorum;
* an expired candidate is never promoted: entering ``promoting`` after ``expires_at``
  raises, whatever the query;
* every insert and every change writes one ``candidate_changed`` outbox event in the same
  transaction, by trigger.

The two partial indexes hold only the rows the sweeps may touch (discovered and analyzing;
promoting), so a sweep never even reads promoted, rejected or expired rows (T5).  Because
T2 holds, a T3 or T4 candidate is always past its ``analysis_deadline``, which is what the
expiry index is ordered by.
"""

from __future__ import annotations

from runner.candidates.states import ACTIVE, TERMINAL, CandidateStatus, allowed_pairs

_STATUSES = ", ".join(f"'{s.value}'" for s in CandidateStatus)
_ACTIVE = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE))
_TERMINAL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
_PAIRS = ", ".join(f"'{a.value}>{b.value}'" for a, b in allowed_pairs())

#: the WHERE term the expiry sweep and its partial index share, spelled identically so
#: that SQLite can use the index
ACTIVE_TERM = f"status IN ({_ACTIVE})"

CANDIDATES_V1 = f"""
CREATE TABLE candidates (
    seq                 INTEGER PRIMARY KEY,
    id                  TEXT NOT NULL UNIQUE,
    status              TEXT NOT NULL DEFAULT 'discovered' CHECK (status IN ({_STATUSES})),
    created_at          TEXT NOT NULL,
    expires_at          TEXT NOT NULL,
    analysis_deadline   TEXT NOT NULL,
    quorum              INTEGER NOT NULL DEFAULT 2 CHECK (quorum >= 1),
    analyses            INTEGER NOT NULL DEFAULT 0,
    promotion_locked_at TEXT,
    decision_id         TEXT,
    reason              TEXT NOT NULL DEFAULT 'created',
    updated_at          TEXT NOT NULL,
    CHECK (analysis_deadline <= expires_at),
    CHECK (status NOT IN ('promoting', 'promoted') OR promotion_locked_at IS NOT NULL),
    CHECK (status NOT IN ('promoting', 'promoted') OR analyses >= quorum),
    CHECK (status <> 'promoted' OR decision_id IS NOT NULL)
) STRICT;

CREATE INDEX candidates_to_expire ON candidates (analysis_deadline) WHERE {ACTIVE_TERM};
CREATE INDEX candidates_promoting ON candidates (promotion_locked_at)
    WHERE status = 'promoting';

CREATE TABLE candidate_analyses (
    seq          INTEGER PRIMARY KEY,
    candidate_id TEXT NOT NULL REFERENCES candidates (id),
    analyst      TEXT NOT NULL,
    analyzed_at  TEXT NOT NULL,
    UNIQUE (candidate_id, analyst)
) STRICT;

CREATE TABLE candidate_sweep (
    one       INTEGER PRIMARY KEY CHECK (one = 1),
    function  TEXT NOT NULL,
    at        TEXT NOT NULL,
    result    TEXT NOT NULL
) STRICT;

CREATE TRIGGER candidates_born_discovered BEFORE INSERT ON candidates
WHEN NEW.status <> 'discovered' OR NEW.analyses <> 0
  OR NEW.promotion_locked_at IS NOT NULL OR NEW.decision_id IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'a candidate is created discovered, with nothing else'); END;

CREATE TRIGGER candidates_no_delete BEFORE DELETE ON candidates
BEGIN SELECT RAISE(ABORT, 'candidates are never deleted'); END;

CREATE TRIGGER candidate_analyses_no_delete BEFORE DELETE ON candidate_analyses
BEGIN SELECT RAISE(ABORT, 'analyses are never deleted'); END;

CREATE TRIGGER candidate_analyses_no_update BEFORE UPDATE ON candidate_analyses
BEGIN SELECT RAISE(ABORT, 'analyses never change'); END;

CREATE TRIGGER candidates_terminal_fixed BEFORE UPDATE ON candidates
WHEN OLD.status IN ({_TERMINAL})
BEGIN SELECT RAISE(ABORT, 'promoted, rejected and expired candidates never change'); END;

CREATE TRIGGER candidates_identity_fixed
BEFORE UPDATE OF seq, id, created_at, expires_at, analysis_deadline, quorum ON candidates
WHEN NEW.seq IS NOT OLD.seq OR NEW.id IS NOT OLD.id OR NEW.created_at IS NOT OLD.created_at
  OR NEW.expires_at IS NOT OLD.expires_at
  OR NEW.analysis_deadline IS NOT OLD.analysis_deadline OR NEW.quorum IS NOT OLD.quorum
BEGIN SELECT RAISE(ABORT, 'a candidate''s id, times and quorum never change'); END;

CREATE TRIGGER candidates_transition_guard BEFORE UPDATE OF status ON candidates
WHEN NEW.status IS NOT OLD.status AND OLD.status || '>' || NEW.status NOT IN ({_PAIRS})
BEGIN SELECT RAISE(ABORT, 'illegal candidate transition'); END;

CREATE TRIGGER candidates_never_promote_expired BEFORE UPDATE OF status ON candidates
WHEN NEW.status = 'promoting' AND OLD.status <> 'promoting'
 AND (NEW.promotion_locked_at IS NULL OR OLD.expires_at < NEW.promotion_locked_at)
BEGIN SELECT RAISE(ABORT, 'an expired candidate is never promoted'); END;

CREATE TRIGGER candidates_lock_set_once BEFORE UPDATE OF promotion_locked_at ON candidates
WHEN NEW.promotion_locked_at IS NOT OLD.promotion_locked_at
 AND NOT (OLD.status <> 'promoting' AND NEW.status = 'promoting')
BEGIN SELECT RAISE(ABORT, 'promotion_locked_at is set only by entering promoting'); END;

CREATE TRIGGER candidates_decision_once BEFORE UPDATE OF decision_id ON candidates
WHEN NEW.decision_id IS NOT OLD.decision_id
 AND (OLD.decision_id IS NOT NULL OR OLD.status <> 'promoting')
BEGIN SELECT RAISE(ABORT, 'a decision is recorded once, while promoting'); END;

CREATE TRIGGER candidates_analyses_counted BEFORE UPDATE OF analyses ON candidates
WHEN NEW.analyses IS NOT
     (SELECT count(*) FROM candidate_analyses WHERE candidate_id = NEW.id)
BEGIN SELECT RAISE(ABORT, 'analyses counts the rows of candidate_analyses'); END;

CREATE TRIGGER candidate_analyses_open BEFORE INSERT ON candidate_analyses
WHEN NOT EXISTS (SELECT 1 FROM candidates
                 WHERE id = NEW.candidate_id AND {ACTIVE_TERM}
                   AND analysis_deadline >= NEW.analyzed_at)
BEGIN SELECT RAISE(ABORT, 'analyses are taken only before the analysis deadline'); END;

CREATE TRIGGER candidate_analyses_count AFTER INSERT ON candidate_analyses
BEGIN
    UPDATE candidates
    SET analyses = analyses + 1, status = 'analyzing', reason = 'analysed',
        updated_at = NEW.analyzed_at
    WHERE id = NEW.candidate_id;
END;

CREATE TRIGGER candidates_created AFTER INSERT ON candidates
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('candidate_changed', NEW.id,
            json_object('from', NULL, 'to', NEW.status, 'reason', NEW.reason,
                        'expires_at', NEW.expires_at,
                        'analysis_deadline', NEW.analysis_deadline,
                        'quorum', NEW.quorum, 'analyses', NEW.analyses),
            NEW.updated_at);
END;

CREATE TRIGGER candidates_changed AFTER UPDATE ON candidates
WHEN NEW.status IS NOT OLD.status OR NEW.analyses IS NOT OLD.analyses
  OR NEW.decision_id IS NOT OLD.decision_id
BEGIN
    INSERT INTO outbox (kind, subject, payload, at)
    VALUES ('candidate_changed', NEW.id,
            json_object('from', OLD.status, 'to', NEW.status, 'reason', NEW.reason,
                        'analyses', NEW.analyses, 'quorum', NEW.quorum,
                        'promotion_locked_at', NEW.promotion_locked_at,
                        'decision_id', NEW.decision_id),
            NEW.updated_at);
END;
"""
