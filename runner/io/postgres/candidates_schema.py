"""PostgreSQL DDL for the candidate lifecycle (SPEC C1, C2, K3): migration v4, as on SQLite.

The same invariants as ``runner.io.sqlite.candidates_schema``, enforced by the database:

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

The checks SQLite spreads over several ``BEFORE UPDATE`` triggers are one PL/pgSQL
function here, in the same order.  Times are fixed-width UTC text compared byte-wise
(``COLLATE "C"``), so text order is time order whatever the database's collation.
"""

from __future__ import annotations

from runner.candidates.states import ACTIVE, TERMINAL, CandidateStatus, allowed_pairs

_STATUSES = ", ".join(f"'{s.value}'" for s in CandidateStatus)
_ACTIVE = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE))
_TERMINAL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
_PAIRS = ", ".join(f"'{a.value}>{b.value}'" for a, b in allowed_pairs())

#: the WHERE term the expiry sweep and its partial index share
ACTIVE_TERM = f"status IN ({_ACTIVE})"


def _raise(message: str) -> str:
    return f"RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';"


CANDIDATES_V1 = f"""
CREATE TABLE {{s}}.candidates (
    seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                  text NOT NULL UNIQUE,
    status              text NOT NULL DEFAULT 'discovered' CHECK (status IN ({_STATUSES})),
    created_at          text COLLATE "C" NOT NULL,
    expires_at          text COLLATE "C" NOT NULL,
    analysis_deadline   text COLLATE "C" NOT NULL,
    quorum              integer NOT NULL DEFAULT 2 CHECK (quorum >= 1),
    analyses            integer NOT NULL DEFAULT 0,
    promotion_locked_at text COLLATE "C",
    decision_id         text,
    reason              text NOT NULL DEFAULT 'created',
    updated_at          text COLLATE "C" NOT NULL,
    CHECK (analysis_deadline <= expires_at),
    CHECK (status NOT IN ('promoting', 'promoted') OR promotion_locked_at IS NOT NULL),
    CHECK (status NOT IN ('promoting', 'promoted') OR analyses >= quorum),
    CHECK (status <> 'promoted' OR decision_id IS NOT NULL)
);

CREATE INDEX candidates_to_expire ON {{s}}.candidates (analysis_deadline)
    WHERE {ACTIVE_TERM};
CREATE INDEX candidates_promoting ON {{s}}.candidates (promotion_locked_at)
    WHERE status = 'promoting';

CREATE TABLE {{s}}.candidate_analyses (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    candidate_id text NOT NULL REFERENCES {{s}}.candidates (id),
    analyst      text NOT NULL,
    analyzed_at  text COLLATE "C" NOT NULL,
    UNIQUE (candidate_id, analyst)
);

CREATE TABLE {{s}}.candidate_sweep (
    one       integer PRIMARY KEY CHECK (one = 1),
    function  text NOT NULL,
    at        text NOT NULL,
    result    text NOT NULL
);

CREATE FUNCTION {{s}}.candidates_born() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'discovered' OR NEW.analyses <> 0
       OR NEW.promotion_locked_at IS NOT NULL OR NEW.decision_id IS NOT NULL THEN
        {_raise("a candidate is created discovered, with nothing else")}
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER candidates_born_discovered BEFORE INSERT ON {{s}}.candidates
FOR EACH ROW EXECUTE FUNCTION {{s}}.candidates_born();

CREATE FUNCTION {{s}}.candidates_never_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {_raise("candidates are never deleted")}
END $$;
CREATE TRIGGER candidates_no_delete BEFORE DELETE ON {{s}}.candidates
FOR EACH ROW EXECUTE FUNCTION {{s}}.candidates_never_deleted();
CREATE TRIGGER candidates_no_truncate BEFORE TRUNCATE ON {{s}}.candidates
FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.candidates_never_deleted();

CREATE FUNCTION {{s}}.analyses_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        {_raise("analyses never change")}
    END IF;
    {_raise("analyses are never deleted")}
END $$;
CREATE TRIGGER candidate_analyses_fixed BEFORE UPDATE OR DELETE ON {{s}}.candidate_analyses
FOR EACH ROW EXECUTE FUNCTION {{s}}.analyses_fixed();
CREATE TRIGGER candidate_analyses_no_truncate BEFORE TRUNCATE ON {{s}}.candidate_analyses
FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.analyses_fixed();

CREATE FUNCTION {{s}}.candidates_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ({_TERMINAL}) THEN
        {_raise("promoted, rejected and expired candidates never change")}
    END IF;
    IF NEW.seq IS DISTINCT FROM OLD.seq OR NEW.id IS DISTINCT FROM OLD.id
       OR NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.expires_at IS DISTINCT FROM OLD.expires_at
       OR NEW.analysis_deadline IS DISTINCT FROM OLD.analysis_deadline
       OR NEW.quorum IS DISTINCT FROM OLD.quorum THEN
        {_raise("a candidate''s id, times and quorum never change")}
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status
       AND OLD.status || '>' || NEW.status NOT IN ({_PAIRS}) THEN
        {_raise("illegal candidate transition")}
    END IF;
    IF NEW.status = 'promoting' AND OLD.status <> 'promoting'
       AND (NEW.promotion_locked_at IS NULL OR OLD.expires_at < NEW.promotion_locked_at) THEN
        {_raise("an expired candidate is never promoted")}
    END IF;
    IF NEW.promotion_locked_at IS DISTINCT FROM OLD.promotion_locked_at
       AND NOT (OLD.status <> 'promoting' AND NEW.status = 'promoting') THEN
        {_raise("promotion_locked_at is set only by entering promoting")}
    END IF;
    IF NEW.decision_id IS DISTINCT FROM OLD.decision_id
       AND (OLD.decision_id IS NOT NULL OR OLD.status <> 'promoting') THEN
        {_raise("a decision is recorded once, while promoting")}
    END IF;
    IF NEW.analyses IS DISTINCT FROM OLD.analyses AND NEW.analyses IS DISTINCT FROM
       (SELECT count(*) FROM {{s}}.candidate_analyses WHERE candidate_id = NEW.id) THEN
        {_raise("analyses counts the rows of candidate_analyses")}
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER candidates_guard BEFORE UPDATE ON {{s}}.candidates
FOR EACH ROW EXECUTE FUNCTION {{s}}.candidates_guard();

CREATE FUNCTION {{s}}.analyses_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{s}}.candidates
                   WHERE id = NEW.candidate_id AND {ACTIVE_TERM}
                     AND analysis_deadline >= NEW.analyzed_at) THEN
        {_raise("analyses are taken only before the analysis deadline")}
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER candidate_analyses_open BEFORE INSERT ON {{s}}.candidate_analyses
FOR EACH ROW EXECUTE FUNCTION {{s}}.analyses_open();

CREATE FUNCTION {{s}}.analyses_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {{s}}.candidates
    SET analyses = analyses + 1, status = 'analyzing', reason = 'analysed',
        updated_at = NEW.analyzed_at
    WHERE id = NEW.candidate_id;
    RETURN NULL;
END $$;
CREATE TRIGGER candidate_analyses_count AFTER INSERT ON {{s}}.candidate_analyses
FOR EACH ROW EXECUTE FUNCTION {{s}}.analyses_count();

CREATE FUNCTION {{s}}.candidates_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{s}}.outbox_append('candidate_changed', NEW.id,
        jsonb_build_object('from', NULL, 'to', NEW.status, 'reason', NEW.reason,
                           'expires_at', NEW.expires_at,
                           'analysis_deadline', NEW.analysis_deadline,
                           'quorum', NEW.quorum, 'analyses', NEW.analyses),
        NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER candidates_created AFTER INSERT ON {{s}}.candidates
FOR EACH ROW EXECUTE FUNCTION {{s}}.candidates_created();

CREATE FUNCTION {{s}}.candidates_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{s}}.outbox_append('candidate_changed', NEW.id,
        jsonb_build_object('from', OLD.status, 'to', NEW.status, 'reason', NEW.reason,
                           'analyses', NEW.analyses, 'quorum', NEW.quorum,
                           'promotion_locked_at', NEW.promotion_locked_at,
                           'decision_id', NEW.decision_id),
        NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER candidates_changed AFTER UPDATE ON {{s}}.candidates
FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status
                   OR NEW.analyses IS DISTINCT FROM OLD.analyses
                   OR NEW.decision_id IS DISTINCT FROM OLD.decision_id)
EXECUTE FUNCTION {{s}}.candidates_changed();
"""
