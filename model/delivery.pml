/*
 * A model of runner's lead delivery protocol (SPEC K3-K5, L3-L8, E1, E2, E5), checked
 * with SPIN.  docs/model.md says what it proves and what it cannot: it is a model of the
 * protocol, not the code.  model/check.py runs every property and every mutation.
 *
 * Actors: a client that accepts records (commit, then answer), WORKERS worker processes
 * that share one worker lock (takeover after a crash: the kernel drops the flock), the
 * target (which may apply a request long after its sender gave up on it), and an operator
 * who may resolve an uncertain record (issue 19).  A worker or the client may crash
 * between any two of its steps; a crash loses everything but what was committed.  Every
 * crash is a CRASH(point) below, named after the crash point in runner/crashpoints.py
 * that sits at the same place in the code (model/steps.toml ties them together).
 *
 * Parameters (spin -DNAME=value): N records (2 or 3), BATCH the largest batch (1: the code
 * today, one record per request; 2-3: the E1 design, issue 16), WORKERS (1 or 2),
 * MAXCRASH crashes in all, MAXFAULT "not sent" answers in all (the target eventually
 * answers), MAXRESOLVE operator decisions.
 *
 * DEDUPE=1: the target deduplicates by write_id (SPEC E7, issue 29): a write of a write_id
 * it already holds makes no second row (a batch row by row) and is answered as a first
 * write, and runner's reconcile pass makes an uncertain record whose readback shows no
 * row failed-safe: an authorised resend.  DEDUPE=0 (the default) is the model as it was.
 * TARGET_RECOVERS=1: a failed read and a dropped request count as faults too (within
 * MAXFAULT): the target answers at last; the liveness run of DEDUPE uses it.
 *
 * REWIND=1: the target marks batches (SPEC E8, issue 30; runner/leads/marks.py): every
 * in-flight mark takes the store's next counter (seq = epoch.counter, SEQ below) in its
 * commit; the target's rule (marks.judge) applies a fence (counter 0) only above the seq
 * it holds, and a batch only in the epoch it holds, above its counter, atomically with the
 * rows (else StaleMark: nothing applied, the batch is failed-safe).  And the store may
 * forget (MAXFORGET times): a Standby copies the whole store at some moment, and later the
 * store is that copy again (a promoted asynchronous standby, a restored backup); the
 * target and the requests in transit keep what they have.  Every start raises the
 * target's fence to a new epoch and only then, in one commit, takes that epoch (Worker:
 * check_marks, fence: runner.tasks.rewind), and rewinds (tags every record that could
 * have been sent in that commit, reads each back after it) only when the mark read at the
 * start, or the mark the fence replaced, is ahead of the store's, and after a StaleMark
 * answer mid-run (refused).  REWIND=0: the model as it was.
 * Mutations (spin -DM_NAME): each is a one-line change that breaks one guarantee; SPIN
 * must find a counterexample for each (model/check.py, tests/test_spin_model.py).
 */

#ifndef N
#define N 3
#endif
#ifndef BATCH
#define BATCH 1
#endif
#ifndef WORKERS
#define WORKERS 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 2
#endif
#ifndef MAXFAULT
#define MAXFAULT 1
#endif
#ifndef NETCAP
#define NETCAP 2
#endif
#ifndef MAXRESOLVE
#define MAXRESOLVE 1
#endif
#ifndef DEDUPE
#define DEDUPE 0
#endif
#ifndef TARGET_RECOVERS
#define TARGET_RECOVERS 0
#endif
#ifndef REWIND
#define REWIND 0
#endif
#ifndef PIPELINE
#define PIPELINE 0
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef MAXFORGET
#define MAXFORGET 1
#endif
#if REWIND && (DEDUPE || defined(M_DEDUPE_NOT_ATOMIC))
#error "REWIND is checked with a target that does not deduplicate"
#endif

/* record states (runner/leads/states.py LeadState); NONE: not in the store */
#define NONE        0
#define PREPARED    1
#define IN_FLIGHT   2
#define CONFIRMED   3
#define FAILED_SAFE 4
#define UNCERTAIN   5
#define REWOUND     6  /* REWIND: uncertain, tagged rewound (last_failure 'rewound'): read
                          back by the rewind after the fence, never by reconcile */

/* what a send came back with */
#define NOT_SENT 1   /* BeforeWriteError: refused before sending, or rate limited (E2) */
#define ANSWERED 2   /* the target answered: read every row back */
#define LOST     3   /* anything else: a timeout, a dropped answer, a cancelled call */
#define STALE    4   /* REWIND: StaleMark, the target holds a newer seq; nothing applied */

/* what a readback saw */
#define SAW_NONE  1  /* no row */
#define SAW_OTHER 2  /* two rows, or a row that differs, or the read failed */

#define BIT(i)    (1 << (i))
#define HAS(m, i) ((((m) >> (i)) & 1) == 1)

/* a failure of the target: unbounded, or (TARGET_RECOVERS) one of the MAXFAULT faults */
#if TARGET_RECOVERS
#define COUNTED_FAULT  faults < MAXFAULT -> faults++;
#else
#define COUNTED_FAULT
#endif

/* whether a write of record k makes a row: always, or (E7) only if the target holds no
   row with its write_id; M_DEDUPE_NOT_ATOMIC: the target lands a request in transit in
   two steps, the check, then the insert (see Target) */
#if DEDUPE
#define WRITES_ROW(k)  (rows[k] == 0)
#else
#define WRITES_ROW(k)  true
#endif

/* the reconcile rule for a readback that shows no row: today it proves nothing (L6);
   a deduplicating target makes it an authorised resend (E7) */
#if (DEDUPE && !defined(M_NO_DEDUPE_RESEND)) || defined(M_RESEND_NONDEDUPE)
#define RESEND_IF_NO_ROW 1
#else
#define RESEND_IF_NO_ROW 0
#endif

/* what a readback takes for "no row" (M_RESEND_DIFFERING_ROW: a row that differs too) */
#ifdef M_RESEND_DIFFERING_ROW
#define SHOWS_NO_ROW(j)  (rows[j] == 0 || bad[j])
#else
#define SHOWS_NO_ROW(j)  (rows[j] == 0)
#endif

#if N == 2
#define FORALL(P) (P(0) && P(1))
#elif N == 3
#define FORALL(P) (P(0) && P(1) && P(2))
#else
#error "N must be 2 or 3"
#endif

#ifdef M_DISPATCH_UNCERTAIN
#define DISPATCHABLE(s) ((s) == PREPARED || (s) == FAILED_SAFE || (s) == UNCERTAIN)
#else
#define DISPATCHABLE(s) ((s) == PREPARED || (s) == FAILED_SAFE)
#endif

/* -- what is durable: the store and the target ---------------------------------------- */
byte st[N];        /* the store: each record's state */
byte rows[N];      /* the target: rows carrying each record's write_id (counted up to 2) */
bool bad[N];       /* the target's row differs from the mapped record */
#if REWIND
chan net = [NETCAP] of { byte, byte };  /* requests in transit: records, and their seq */
#else
chan net = [NETCAP] of { byte };  /* requests in transit: a bitmask of records each */
#endif

/* -- ghosts: observations for the properties, never read by the protocol --------------- */
bool acked[N];     /* the client got the answer "accepted" */
bool unc[N];       /* became uncertain and no operator released it since */
byte intr[N];      /* requests carrying the record still in transit */
byte owed;         /* records whose reconcile call the running cycle still owes */

byte lock;         /* the worker lock: 0 free, else the holder's id */
byte crashes;      /* crashes so far (all processes) */
byte faults;       /* "not sent" answers so far */
byte resolves;     /* operator decisions so far */

#if REWIND
/* -- REWIND: the marks (runner/leads/marks.py), and a store that forgets ------------------
   A seq is epoch.counter (seq_of: epoch << 32 | counter; here epoch * 16 + counter).  */
#define SEQ(e, c)    ((e) * 16 + (c))
#define EPOCH_OF(s)  ((s) / 16)
byte ep, ctr;      /* the store: its epoch, and the last counter it gave a batch */
bool rw;           /* the store: a rewind is pending (store_marks.rewind) */
bool fenced;       /* the store: the target's fence stands at its epoch (fenced_epoch) */
byte tseq;         /* the target: the seq it holds (TargetMark.seq; 0: no mark yet) */
byte forgets;      /* times the store forgot so far */
byte gen;          /* which copy of the store the workers talk to (bumped by a forget) */
bool snapped;      /* the Standby holds a copy: */
byte sst[N];       /*   each record's state */
bool sunc[N];      /*   the ghost unc[], which follows the store's history */
byte sep, sctr;    /*   the epoch and the counter */
bool srw, sfenced; /*   the pending rewind, the fence flag */
/* marks.judge: TargetMark(None, 0) (no mark yet) takes any mark; a fence (counter 0)
   applies only above the seq held; a batch only in the epoch held, above its counter */
#ifdef M_NO_MARK_CHECK
#define FENCE_OK(s)  true
#define BATCH_OK(s)  true
#else
#define FENCE_OK(s)  (tseq == 0 || (s) > tseq)
#ifdef M_BATCH_BY_SEQ
/* seq order alone, any epoch: not a mutation, SPIN finds no duplicate (docs/model.md):
   with one store, every batch is sent after its epoch's fence stood, so no batch of an
   epoch above the one held exists, and the two rules accept the same batches */
#define BATCH_OK(s)  (tseq == 0 || (s) > tseq)
#else
#define BATCH_OK(s)  (tseq == 0 || (EPOCH_OF(s) == EPOCH_OF(tseq) && (s) > tseq))
#endif
#endif
#define KEEP_MARK(s) tseq = ((s) > tseq -> (s) : tseq)
#endif

/* A crash where the process stands: it dies (os._exit), keeping only what committed.
   Every step below opens with one, so a process may crash between any two steps.  The
   argument names the crash point(s) of runner/crashpoints.py at that place ("/": the
   same gap in the model serves several points); model/steps.toml maps them to the code,
   and tests/test_spin_model.py checks both sides.  */
#define CRASH(point) if :: crashes < MAXCRASH -> crashes++; goto crashed :: true fi
/* the same, at a step of the rewind: runner/crashpoints.py has no point there yet */
#define CRASH_UNNAMED if :: crashes < MAXCRASH -> crashes++; goto crashed :: true fi

/* REWIND: a worker whose store forgot (its session ended with the old primary) finds out
   at its next store step: it starts again, as after a crash (the lock went with it) */
#if REWIND
#define LOST_STORE if :: gen != mygen -> goto crashed :: else fi
#else
#define LOST_STORE skip
#endif

/* the target applies a request atomically: all its rows or none (E1) */
inline apply(mask, differs) {
  for (k : 0 .. N - 1) {
    if
    :: HAS(mask, k) && WRITES_ROW(k) ->
       rows[k] = (rows[k] < 2 -> rows[k] + 1 : 2);
       bad[k] = bad[k] || differs
    :: else  /* not in the request, or (E7) a write_id the target holds: no second row */
    fi
  };
  k = 0
}

inline in_transit(mask, delta) {
  for (k : 0 .. N - 1) {
    if :: HAS(mask, k) -> intr[k] = intr[k] + delta :: else fi
  };
  k = 0
}

#if REWIND
/* REWIND: a marked request, applied atomically with the check and the new mark, or
   refused whole (marks.judge, write_batch(items, mark=...)) */
#define APPLY_MARKED(mask, s, differs, answer) \
  true -> /* a step of its own: the check's else is not the caller's */ \
  if \
  :: BATCH_OK(s) -> apply(mask, differs); KEEP_MARK(s); res = answer \
  :: else -> res = (answer == ANSWERED -> STALE : LOST) \
  fi
#define SEND_AND_APPLY(differs, answer)  APPLY_MARKED(batch, bseq, differs, answer)
#define PUT_IN_TRANSIT                   net ! batch, bseq
#else
#define SEND_AND_APPLY(differs, answer)  apply(batch, differs); res = answer
#define PUT_IN_TRANSIT                   net ! batch
#endif

/* -- accept (runner/leads/intake.py): commit, then answer ----------------------------------- */
#define COMMIT_ACCEPT  if :: st[i] == NONE -> st[i] = PREPARED :: else fi  /* L3: a duplicate changes nothing */
#define ANSWER         acked[i] = true
#ifdef M_ACK_BEFORE_COMMIT
#define ACCEPT_STEP_1  ANSWER
#define ACCEPT_STEP_2  COMMIT_ACCEPT
#else
#define ACCEPT_STEP_1  COMMIT_ACCEPT
#define ACCEPT_STEP_2  ANSWER
#endif

active proctype Client() {
  byte i = 0;
next:
  do
  :: atomic { i < N -> CRASH(accept_before_commit); ACCEPT_STEP_1 }
     atomic { CRASH(accept_after_commit); ACCEPT_STEP_2; i++ }
  :: i >= N -> break
  od;
  goto done;
crashed:
  /* the sender resends what was not answered (a webhook retries until it gets a 200) */
  atomic { if :: acked[i] -> i++ :: else fi; goto next }
done:
  skip
}

/* -- the worker (runner/tasks/deliver.py run_cycle, as `start` runs it) ---------------- */

/* the outcomes of the batch sent last, committed together (DispatchSteps.finish_and_mark) */
inline commit_outcomes() {
  for (k : 0 .. N - 1) {
    if
    :: HAS(pend, k) && st[k] == IN_FLIGHT ->
       if
       :: HAS(pok, k) -> st[k] = CONFIRMED
       :: !HAS(pok, k) && HAS(pfs, k) -> st[k] = FAILED_SAFE
       :: else -> st[k] = UNCERTAIN; unc[k] = true
       fi
    :: else
    fi
  };
  pend = 0; pok = 0; pfs = 0
}

/* the next batch: 1 to BATCH dispatchable records after the last one sent, in accept
   order (store.dispatchable_page) */
inline select_batch() {
  if
  :: take = 1
  :: BATCH >= 2 -> take = 2
  :: BATCH >= 3 -> take = 3
  fi;
  for (k : 0 .. N - 1) {
    if
    :: k >= nxt && n < take && DISPATCHABLE(st[k]) -> batch = batch | BIT(k); n++; last = k + 1
    :: else
    fi
  };
  nxt = (batch != 0 -> last : nxt);
  n = 0; take = 0; last = 0
}

inline mark_in_flight() {
  for (k : 0 .. N - 1) {
    if :: HAS(batch, k) -> st[k] = IN_FLIGHT :: else fi
  };
#if REWIND
  /* the batch takes the store's next counter, in the same commit */
  if :: batch != 0 -> ctr++; assert(ctr < 16); bseq = SEQ(ep, ctr) :: else fi;
#endif
  k = 0
}

/* every record uncertain at the cycle's start is read back once; only an exact match
   confirms (L6) */
inline reconcile_pass() {
  do
  :: atomic {
       CRASH(recover_after_commit / reconcile_after_commit);
       LOST_STORE;
       /* the next uncertain record (store.uncertain_page); the others owe nothing */
       do
       :: i < N && st[i] != UNCERTAIN -> owed = owed & ~BIT(i); i++
       :: else -> break
       od;
       if
       :: i >= N -> i = 0; break
       :: else
       fi;
       /* its readback (CRMRecordPort.confirm, port.classify_readback) */
       if
       :: ok = (rows[i] == 1 && !bad[i]); saw = (SHOWS_NO_ROW(i) -> SAW_NONE : SAW_OTHER)
       :: COUNTED_FAULT saw = SAW_OTHER  /* the target cannot be read */
       fi
     }
     atomic {
       CRASH(reconcile_before_commit);
       LOST_STORE;
       if
       :: st[i] == UNCERTAIN && ok -> st[i] = CONFIRMED
#ifdef M_EMPTY_READ_IS_NOT_SENT
       :: st[i] == UNCERTAIN && saw == SAW_NONE -> st[i] = FAILED_SAFE
#endif
#ifdef M_SEND_IN_RECONCILE
       /* the record with no row is sent at once, in the pass (its answer is lost) */
       :: st[i] == UNCERTAIN && saw == SAW_NONE -> st[i] = IN_FLIGHT; unc[i] = false;
          apply(BIT(i), false)
#elif RESEND_IF_NO_ROW
       /* E7: no row on a deduplicating target: an authorised resend, recorded with its
          audit row in this commit; the dispatch sends it on the backoff schedule */
       :: st[i] == UNCERTAIN && saw == SAW_NONE -> st[i] = FAILED_SAFE; unc[i] = false
#endif
       :: else -> skip  /* still uncertain; a reconcile attempt is counted */
       fi;
       owed = owed & ~BIT(i); i++; ok = false; saw = 0
     }
  od
}

/* one request; the target applies it atomically, or not at all */
inline send_request() {
  atomic {
    CRASH(dispatch_after_in_flight);
    if
    :: faults < MAXFAULT -> faults++; res = NOT_SENT
    :: SEND_AND_APPLY(false, ANSWERED)
    :: SEND_AND_APPLY(false, LOST)      /* applied; the answer is lost */
    :: SEND_AND_APPLY(true, ANSWERED)   /* applied, but not as the mapped record */
    :: nfull(net) -> PUT_IN_TRANSIT; in_transit(batch, 1); res = LOST  /* may land later */
    fi
  }
}

/* an exact readback of every row of the batch (send_blocking, classify_readback) */
/* the crash points after the request are one state here: applied (or not), the answer
   given or not, nothing recorded (dispatch.batch-applied and dispatch.batch-mid-readback
   are in the synthetic target) */
inline read_back() {
  atomic {
    CRASH(dispatch_after_write / dispatch_batch_applied / dispatch_batch_mid_readback);
    pend = batch;
    if
    :: res == NOT_SENT -> pfs = batch
#if REWIND
    :: res == STALE -> pfs = batch; stale = true  /* failed-safe; refused() */
#endif
    :: res == ANSWERED ->
#ifdef M_CONFIRM_WITHOUT_READBACK
       pok = batch
#else
       if
       :: for (k : 0 .. N - 1) {
            if :: HAS(batch, k) && rows[k] == 1 && !bad[k] -> pok = pok | BIT(k)
               :: else
            fi
          }
       :: COUNTED_FAULT skip  /* the readback failed: unproven, uncertain */
       fi
#endif
#ifdef M_LOST_ANSWER_IS_NOT_SENT
    :: res == LOST -> pfs = batch
#else
    :: res == LOST -> skip  /* uncertain */
#endif
    fi;
    batch = 0; res = 0; k = 0
#if REWIND
    ; bseq = 0
#endif
  }
}

#if !PIPELINE
/* prepared and failed-safe records in accept order, 1 to BATCH per request (L8, E1) */
inline dispatch_pass() {
  do
#if SPLIT
  /* the step apart (PostgreSQL, issue 32): the last batch's outcomes and this batch's
     in-flight mark are two transactions at once, committed in either order, a crash
     possibly between them */
  :: if
#if REWIND
     /* StaleMark: the run ends; its outcomes commit alone (no mark beside them) */
     :: stale ->
        atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE;
                 commit_outcomes() };
        nxt = 0; break
     :: !stale ->
#else
     :: true ->
#endif
        if
        :: atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE;
                    commit_outcomes() };
           atomic { CRASH(dispatch_before_confirm); LOST_STORE; select_batch();
                    mark_in_flight() }
        :: atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE;
                    select_batch(); mark_in_flight() };
           atomic { CRASH(dispatch_before_confirm); LOST_STORE; commit_outcomes() }
        fi
     fi;
     if :: batch == 0 -> nxt = 0; break :: else fi;
     send_request();
     read_back()
#else
  :: atomic {
       CRASH(dispatch_before_confirm / reconcile_after_commit);
       LOST_STORE;
       /* one commit: the last batch's outcomes and this batch's in-flight mark */
       commit_outcomes();
#if REWIND
       /* StaleMark: the target holds a seq this store does not remember giving: the
          dispatch ends (refused() then rewinds, under the same lock) */
       if :: stale -> nxt = 0; break :: else fi;
#endif
       select_batch();
#ifndef M_MARK_AFTER_SEND
       mark_in_flight();
#endif
       if :: batch == 0 -> nxt = 0; break :: else fi
     }
     send_request();
#ifdef M_MARK_AFTER_SEND
     atomic { CRASH(dispatch_after_write); mark_in_flight() }
#endif
     read_back()
#endif
  od
}
#else
/* PIPELINE: the commit of the outcomes read back last (pend) and the in-flight mark of
   the next batch (nbatch, nseq), made while `batch` (bseq), marked by the commit before,
   is at the target; `batch` stays the one going out */
inline mark_next() {
  commit_outcomes();
  mark_following()
}

/* the next batch's in-flight mark alone (mark_next without the outcomes) */
inline mark_following() {
  nbatch = batch; batch = 0;
#if REWIND
  nseq = bseq; bseq = 0;
#endif
  select_batch();
  mark_in_flight();
  batch = batch ^ nbatch; nbatch = batch ^ nbatch; batch = batch ^ nbatch
#if REWIND
  ; bseq = bseq ^ nseq; nseq = bseq ^ nseq; bseq = bseq ^ nseq
#endif
}

#ifdef M_PIPELINE_MARK_WITH_OWN_SEND
/* the mutation: the overlap taken with the batch's own request: it goes out as it is
   selected, and its in-flight mark commits beside that request (before it or after) */
inline dispatch_pass() {
  do
  :: atomic {
       CRASH(dispatch_before_confirm / reconcile_after_commit);
       LOST_STORE;
       commit_outcomes();
       select_batch();
       if :: batch == 0 -> nxt = 0; break :: else fi
     }
     if
     :: atomic { LOST_STORE; mark_in_flight() }; send_request()
     :: send_request(); atomic { CRASH(dispatch_after_write); LOST_STORE; mark_in_flight() }
     fi;
     read_back()
  od
}
#else
#if SPLIT
/* the step apart (PostgreSQL, issue 32): the outcomes and the next mark are two
   transactions at once, committed in either order, a crash possibly between them */
#define MARK_NEXT \
  if \
  :: atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE; \
              commit_outcomes() }; \
     atomic { CRASH(dispatch_before_confirm); LOST_STORE; mark_following() } \
  :: atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE; \
              mark_following() }; \
     atomic { CRASH(dispatch_before_confirm); LOST_STORE; commit_outcomes() } \
  fi
#else
#define MARK_NEXT \
  atomic { CRASH(dispatch_before_confirm / reconcile_after_commit); LOST_STORE; mark_next() }
#endif

/* prepared and failed-safe records in accept order, 1 to BATCH per request (L8, E1), two
   batches in flight at most: the one at the target and the next one, marked beside it */
inline dispatch_pass() {
  do
  :: if
     :: MARK_NEXT; if :: batch != 0 -> send_request() :: else fi
     :: batch != 0 -> send_request(); MARK_NEXT
     fi;
     if :: batch != 0 -> read_back() :: else fi;
#if REWIND
     /* StaleMark: its outcomes commit and nothing more is sent; the next batch, marked
        beside it and never sent, is recorded failed-safe after them (the loop's
        record of a run that ended: PipelinedBatchRun._end_unsent); refused() then
        rewinds, under the same lock: its tags take it in, its readback finds no row */
     if
     :: stale ->
        atomic { CRASH(dispatch_before_confirm); LOST_STORE; commit_outcomes() };
        atomic {
          CRASH(dispatch_before_confirm);
          LOST_STORE;
          for (k : 0 .. N - 1) {
            if :: HAS(nbatch, k) && st[k] == IN_FLIGHT -> st[k] = FAILED_SAFE :: else fi
          };
          k = 0; nbatch = 0; nseq = 0
        };
        nxt = 0; break
     :: else
     fi;
#endif
     atomic {
       /* the next batch goes out; none, and no outcome pending: the pass is done */
       batch = nbatch; nbatch = 0;
#if REWIND
       bseq = nseq; nseq = 0;
#endif
       if :: batch == 0 && pend == 0 -> nxt = 0; break :: else fi
     }
  od
}
#endif
#endif

#if REWIND
/* -- the store behind its target (runner.tasks.rewind) ----------------------------------- */

/* rewind_mark_sendable, rewind_tag (MarkOps.begin_epoch, tag_rewind): every record that
   could have been sent becomes uncertain, tagged rewound */
#define MAY_HAVE_BEEN_SENT(s) \
  ((s) == PREPARED || (s) == FAILED_SAFE || (s) == IN_FLIGHT || (s) == UNCERTAIN)
inline tag_all() {
  for (k : 0 .. N - 1) {
    if :: MAY_HAVE_BEEN_SENT(st[k]) -> st[k] = REWOUND; unc[k] = true :: else fi
  };
  k = 0;
  rw = true
}

/* read_rewound, at the start of each cycle while a rewind is pending and its fence
   stands: every rewound record is read back, one a step (its readback and the commit of
   what it shows: after the fence nothing can change its rows between the two); one exact
   row confirms, no row makes it sendable (a kept authorisation), anything else leaves it
   uncertain for the operator; a failed read ends the pass (the record stays rewound,
   read again next cycle); none left: rewind_done */
#define REWIND_READABLE (rw && fenced)
inline rewind_readback() {
  do
  :: atomic {
       CRASH_UNNAMED;
       LOST_STORE;
       do
       :: i < N && st[i] != REWOUND -> i++
       :: else -> break
       od;
       if
       :: i >= N -> i = 0; rw = false; break  /* rewind_done */
       :: else
       fi;
       if
#ifdef M_REWIND_WITHOUT_READBACK
       :: st[i] = FAILED_SAFE; unc[i] = false  /* sendable, nothing read */
#else
       :: rows[i] == 1 && !bad[i] -> st[i] = CONFIRMED                      /* sent: done */
       :: rows[i] == 0 -> st[i] = FAILED_SAFE; unc[i] = false      /* not sent: sendable */
       :: rows[i] > 1 || bad[i] -> st[i] = UNCERTAIN                /* for the operator */
#endif
       :: faults < MAXFAULT -> faults++; i = 0; break  /* the read failed: next cycle */
       fi;
       i++
     }
  od
}

/* _forgot: a mark of this store newer than the seq the store remembers */
#ifdef M_FENCE_NO_REPLACED
#define FORGOT_REPLACED false  /* the fence's answer is not looked at */
#else
#define FORGOT_REPLACED (!why && replaced > remembered)
#endif

/* the seq of a fence above `s` and the store's: a new epoch, counter 0 (M_SAME_EPOCH: the
   counter jumps past it, in the same epoch) */
#ifdef M_SAME_EPOCH
#define FENCE_ABOVE(s) (((s) > SEQ(ep, ctr) -> (s) : SEQ(ep, ctr)) + 1)
#else
#define FENCE_ABOVE(s) SEQ((EPOCH_OF(s) > ep -> EPOCH_OF(s) : ep) + 1, 0)
#endif

/* the store takes the fence's epoch (begin_fenced_epoch, one commit): the epoch, with a
   reason every record that could have been sent tagged rewound, and the record that the
   fence stands */
inline take_epoch(tags) {
  ep = EPOCH_OF(fseq); ctr = fseq - SEQ(ep, 0);
  if :: tags -> tag_all() :: else fi;
  assert(ep < 15)
}

/* fence (runner.tasks.rewind.fence): the target's fence raised to a new epoch above the
   store's and the held mark's, and only then, in one commit, the store's epoch, a
   rewind's tags (when `why` says so, or the mark the fence replaced is ahead of the
   store's) and the fence recorded: a start that stops half-way leaves the store as it
   was.  M_EPOCH_BEFORE_RAISE: the first order (the epoch and the tags committed first,
   the fence recorded in a last commit) */
#ifdef M_READ_BEFORE_FENCE
#define TAGS (why && !early)
#else
#define TAGS why
#endif
inline fence() {
  remembered = SEQ(ep, ctr);
  fseq = FENCE_ABOVE(held);
#ifdef M_EPOCH_BEFORE_RAISE
  atomic { CRASH_UNNAMED; LOST_STORE; take_epoch(why); fenced = false }
#endif
#ifdef M_READ_BEFORE_FENCE
  /* the rewind tags and reads back first, then raises the fence, and takes what it read
     as done (no tags at the fence) */
  if
  :: why -> atomic { CRASH_UNNAMED; LOST_STORE; tag_all() }; rewind_readback(); early = true
  :: else
  fi;
#endif
  do
  :: /* raise_mark: the fence alone, no rows, judged (marks.judge) and answered with the
        mark it replaced in one target operation; refused as stale (it applied nothing,
        the answer carries the mark held); or it fails (TargetUnavailable: no send, the
        next cycle or start reads the mark and tries again) */
     atomic {
       CRASH_UNNAMED;
       replaced = tseq;
       if
       :: FENCE_OK(fseq) -> KEEP_MARK(fseq); raised = true
       :: else  /* StaleMark */
       :: faults < MAXFAULT -> faults++; goto crashed  /* failed: one of the faults */
       fi
     };
     /* _forgot: a forgotten batch landed after the read (the store decides in memory) */
     if :: FORGOT_REPLACED -> why = true :: else fi;
     if :: raised -> break :: else fi;
     /* refused (unreachable with one store): above the mark held, once more */
     fseq = FENCE_ABOVE(replaced);
     assert(EPOCH_OF(fseq) < 15)
  od;
  atomic {
    CRASH_UNNAMED;
    LOST_STORE;
#ifdef M_EPOCH_BEFORE_RAISE
    if :: why && !rw -> tag_all() :: else fi;  /* fence_raised, and a late reason's tags */
#else
    take_epoch(TAGS);  /* begin_fenced_epoch */
#endif
    fenced = true;
    raised = false; why = false; replaced = 0; remembered = 0; fseq = 0
#ifdef M_READ_BEFORE_FENCE
    ; early = false
#endif
  }
}

/* check_marks (at every start under the lock): what the store remembers and what the
   target holds (read_mark); a rewind's reason: the target ahead of the store, or a rewind
   pending whose fence the store never recorded (a store of the first order) */
inline check_marks() {
  atomic {
    CRASH_UNNAMED;
    LOST_STORE;
    held = tseq;
    why = (held > SEQ(ep, ctr) || (rw && !fenced))
  }
#ifdef M_NO_FENCE_AT_START
  /* the first design: a new epoch and its fence only when the start rewinds */
  if :: why -> fence() :: else -> held = 0 fi
#else
  fence()
#endif
}

/* refused (a batch refused as stale mid-run): read the mark, then the fence, always with
   a reason */
inline refused() {
  atomic { CRASH_UNNAMED; LOST_STORE; held = tseq; why = true; stale = false };
  fence()
}

#endif

#ifdef M_NO_LOCK
#define ACQUIRE_LOCK skip
#else
#define ACQUIRE_LOCK lock == 0 -> lock = me  /* refused while another lives; started again later */
#endif

proctype Worker(byte me) {
  byte i, k, n, last, nxt, take, batch, pend, pok, pfs, res, saw;
  bool ok;
#if PIPELINE
  byte nbatch;  /* the next batch, marked in flight beside the request of `batch` */
#if REWIND
  byte nseq;
#endif
#endif
#if REWIND
  byte mygen, bseq, held, replaced, remembered, fseq;
  bool start, stale, why, raised;  /* start: check the marks; stale: a StaleMark answer */
#ifdef M_READ_BEFORE_FENCE
  bool early;  /* the rewind read back before the fence */
#endif
restart:
  atomic { ACQUIRE_LOCK; mygen = gen; start = true }
#else
restart:
  atomic { ACQUIRE_LOCK }
#endif
cycle:
  /* recover: one commit makes every in-flight record uncertain (deliver.recover) */
  atomic {
    CRASH(recover_before_commit / dispatch_after_confirm);
    LOST_STORE;
    for (k : 0 .. N - 1) {
      if
#ifdef M_RETRY_IN_FLIGHT
      :: st[k] == IN_FLIGHT -> st[k] = FAILED_SAFE
#elif defined(M_NO_RECOVER)
      :: false
#else
      :: st[k] == IN_FLIGHT -> st[k] = UNCERTAIN; unc[k] = true
#endif
      :: else
      fi
    };
    owed = 0;
    for (k : 0 .. N - 1) {
      if :: st[k] == UNCERTAIN -> owed = owed | BIT(k) :: else fi
    };
    k = 0
  }
#if REWIND
  if :: start -> check_marks(); start = false :: else fi;
  if :: REWIND_READABLE -> rewind_readback() :: else fi;
#endif
#ifdef M_DISPATCH_BEFORE_RECONCILE
  dispatch_pass();
  reconcile_pass();
#else
  reconcile_pass();
  dispatch_pass();
#endif
#if REWIND
  if :: stale -> refused() :: else fi;
#endif
  goto cycle;
crashed:
  atomic {
    if :: lock == me -> lock = 0; owed = 0 :: else fi;  /* the kernel drops the flock */
    i = 0; k = 0; n = 0; last = 0; nxt = 0; take = 0; batch = 0; pend = 0; pok = 0;
    pfs = 0; res = 0; saw = 0; ok = false;
#if PIPELINE
    nbatch = 0;
#if REWIND
    nseq = 0;
#endif
#endif
#if REWIND
    bseq = 0; held = 0; replaced = 0; remembered = 0; fseq = 0; start = false; stale = false;
    why = false; raised = false;
#endif
#ifdef M_READ_BEFORE_FENCE
    early = false;
#endif
    goto restart
  }
}

/* -- the target: a request in transit lands later, or never ---------------------------- */
#if REWIND
#define RECEIVE    net ? m, s
#define LANDED     s = 0
#define LAND(m)    if :: BATCH_OK(s) -> apply(m, false); KEEP_MARK(s) :: else fi
#else
#define RECEIVE    net ? m
#define LANDED     skip
#define LAND(m)    apply(m, false)
#endif
active proctype Target() {
  byte m, k;
#if REWIND
  byte s;      /* the seq of the request (a request refused as stale applies nothing) */
#endif
#ifdef M_DEDUPE_NOT_ATOMIC
  byte fresh;  /* the rows of the request the target found absent */
#endif
end:
  do
#ifdef M_DEDUPE_NOT_ATOMIC
  /* the target checks which write_ids it lacks, then inserts those: a write between the
     two (a resend) is not seen by the check */
  :: atomic {
       net ? m ->
       for (k : 0 .. N - 1) {
         if :: HAS(m, k) && rows[k] == 0 -> fresh = fresh | BIT(k) :: else fi
       };
       k = 0
     }
     atomic {
       for (k : 0 .. N - 1) {
         if :: HAS(fresh, k) -> rows[k] = (rows[k] < 2 -> rows[k] + 1 : 2) :: else fi
       };
       in_transit(m, -1); m = 0; fresh = 0
     }
#else
  :: atomic { RECEIVE -> LAND(m); in_transit(m, -1); m = 0; LANDED }
#endif
#if TARGET_RECOVERS
  :: atomic {  /* dropped: never applied; one of the MAXFAULT faults */
       nempty(net) && faults < MAXFAULT -> faults++; RECEIVE -> in_transit(m, -1); m = 0;
       LANDED
     }
#else
  :: atomic { RECEIVE -> in_transit(m, -1); m = 0; LANDED }  /* dropped: never applied */
#endif
  od
}

/* -- the operator's resolve (issue 19, `runner resolve`): under the worker lock (refused
      while a worker lives), `not-sent` after a fresh readback shows no row; `confirmed`
      after the operator checked the row by other means ------------------------------- */
#define OPERATOR 9
#ifdef NO_ASSUMPTION_A1
#define A1(j) true
#else
/* assumption A1: no request carrying the record can still reach the target */
#define A1(j) (intr[j] == 0)
#endif
#define MAY_RESOLVE(j) (lock == 0 && resolves < MAXRESOLVE && st[j] == UNCERTAIN)
#ifdef M_RESOLVE_WITHOUT_READBACK
#define FRESH_READBACK none = true
#else
/* one more exact readback; refused if a row is there or the target cannot be read */
#define FRESH_READBACK if :: none = (rows[i] == 0) :: none = false fi
#endif

active proctype Operator() {
  byte i;
  bool none;
end:
  do
  :: atomic {
       /* --as not-sent: take the lock, read back */
       if
       :: !none && MAY_RESOLVE(0) && A1(0) -> i = 0
       :: !none && MAY_RESOLVE(1) && A1(1) -> i = 1
#if N == 3
       :: !none && MAY_RESOLVE(2) && A1(2) -> i = 2
#endif
       fi;
       lock = OPERATOR;
       FRESH_READBACK;
       if :: !none -> lock = 0; i = 0 :: else fi  /* refused */
     }
  :: atomic {
       /* ... and record the decision: the record may be sent again */
       none ->
       if
       :: st[i] == UNCERTAIN -> st[i] = FAILED_SAFE; unc[i] = false; resolves++
       :: else
       fi;
       lock = 0; none = false; i = 0
     }
  :: atomic {
       /* --as confirmed, on the operator's word after checking the row */
       if
       :: MAY_RESOLVE(0) && rows[0] == 1 && !bad[0] -> st[0] = CONFIRMED; resolves++
       :: MAY_RESOLVE(1) && rows[1] == 1 && !bad[1] -> st[1] = CONFIRMED; resolves++
#if N == 3
       :: MAY_RESOLVE(2) && rows[2] == 1 && !bad[2] -> st[2] = CONFIRMED; resolves++
#endif
       fi
     }
  od
}

#if REWIND
/* -- the store forgets (REWIND): a copy of the whole store at some moment (an
      asynchronous standby's last replayed commit, a backup), and later the store is that
      copy again; the target and the requests in transit keep what they have.  The copy is
      taken once the client has its answers (the model's forgotten history loses no
      accepted record: see docs/model.md) ----------------------------------------------- */
#define ANSWERED_TO(i) (acked[i])
active proctype Standby() {
  byte k;
end:
  do
  :: atomic {
       !snapped && forgets < MAXFORGET && FORALL(ANSWERED_TO) ->
       for (k : 0 .. N - 1) { sst[k] = st[k]; sunc[k] = unc[k] };
       sep = ep; sctr = ctr; srw = rw; sfenced = fenced; snapped = true; k = 0
     }
  :: atomic {
       /* the promotion, or the restore: the store is the copy; every worker's session
          ended with the old store (its lock with it) */
       snapped ->
       for (k : 0 .. N - 1) { st[k] = sst[k]; unc[k] = sunc[k]; sst[k] = 0; sunc[k] = false };
       ep = sep; ctr = sctr; rw = srw; fenced = sfenced; sep = 0; sctr = 0; srw = false;
       sfenced = false; snapped = false; k = 0;
       forgets++; gen++; owed = 0;
       if :: lock != OPERATOR -> lock = 0 :: else fi
     }
  od
}
#endif

init {
  byte w = 1;
  atomic {
    do
    :: w <= WORKERS -> run Worker(w); w++
    :: else -> break
    od
  }
}

/* -- the properties, each named after the guarantee it checks ------------------------- */
#define ONE_ROW_AT_MOST(i)   (rows[i] <= 1)
#define CONFIRMED_EXACT(i)   (st[i] != CONFIRMED || (rows[i] == 1 && !bad[i]))
#define NOT_RESENT(i)        (!(unc[i] && st[i] == IN_FLIGHT))
#define ACKED_STORED(i)      (!acked[i] || st[i] != NONE)
#define NOT_IN_FLIGHT(i)     (st[i] != IN_FLIGHT)
#define SETTLED(i)           (st[i] == CONFIRMED || st[i] == UNCERTAIN)
#define CONFIRMED_AT_LAST(i) (st[i] == CONFIRMED || (bad[i] && st[i] == UNCERTAIN))

/* never two target rows for one write_id */
ltl no_duplicate_write { [] FORALL(ONE_ROW_AT_MOST) }
/* a record is confirmed only while the target holds exactly its own row */
ltl confirmed_by_readback { [] FORALL(CONFIRMED_EXACT) }
/* an uncertain record is never sent again by runner (only after an operator's not-sent,
   or, on a deduplicating target, a reconcile readback that showed no row) */
ltl uncertain_never_resent { [] FORALL(NOT_RESENT) }
/* every acknowledged record is in the store */
ltl acknowledged_never_lost { [] FORALL(ACKED_STORED) }
/* nothing is in flight while a reconcile call of the cycle is still owed */
ltl no_dispatch_during_reconcile { [] (owed == 0 || FORALL(NOT_IN_FLIGHT)) }
/* under weak fairness, every record ends confirmed or uncertain (and visible) */
ltl every_record_settles { <> [] FORALL(SETTLED) }
/* DEDUPE, TARGET_RECOVERS: under weak fairness, every record ends confirmed, unless the
   target stored a row that differs from it (then it stays uncertain, for the operator) */
ltl every_record_confirmed { <> [] FORALL(CONFIRMED_AT_LAST) }
