"""The candidate part of the Store contract (C1-C4, K3), run against every backend."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from runner.candidates import Candidate, CandidateStatus, rules
from runner.errors import RuleViolation
from runner.io.stores import open_store
from runner.store import Store
from tests.lifecycle_fixtures import T0, add, at, promoted, promoting, snapshot, statuses

S = CandidateStatus


async def events(store: Store, since: int = 0) -> int:
    return (await store.summary()).outbox_by_kind.get("candidate_changed", 0) - since


async def test_each_promotion_step_commits_with_its_event(store: Store) -> None:
    c = await add(store, "c1")
    assert (c.status, await events(store)) == (S.DISCOVERED, 1)
    c = await store.analyze_candidate("c1", "analyst-a", at(1))
    assert (c.status, c.analysts, await events(store)) == (S.ANALYZING, ("analyst-a",), 2)
    c = await store.analyze_candidate("c1", "analyst-b", at(2))
    assert (c.status, c.analyses, c.has_quorum, await events(store)) == (S.ANALYZING, 2, True, 3)
    c = await store.begin_promotion("c1", at(3))
    assert (c.status, c.promotion_locked_at, c.decision_id) == (S.PROMOTING, at(3), None)
    assert await store.get_candidate("c1") == c            # committed, visible to a read
    c = await store.record_decision("c1", "decision-1", at(3))
    assert (c.status, c.decision_id) == (S.PROMOTING, "decision-1")
    c = await store.finish_promotion("c1", at(3))
    assert (c.status, c.decision_id, await events(store)) == (S.PROMOTED, "decision-1", 6)


async def test_candidates_work_on_a_store_without_a_pinned_scope(db_location: str) -> None:
    async with await open_store(db_location) as unscoped:
        assert unscoped.scope is None
        await add(unscoped, "c1", analysts=("a1", "a2"))
        assert (await unscoped.begin_promotion("c1", at(1))).status is S.PROMOTING


@pytest.mark.parametrize(("operation", "reason"), [
    (lambda s: s.add_candidate(rules.new_candidate("c-ready", T0)), "duplicate_candidate"),
    (lambda s: s.analyze_candidate("nope", "a1", at(1)), "unknown_candidate"),
    (lambda s: s.analyze_candidate("c-ready", "a1", at(1)), "duplicate_analyst"),
    (lambda s: s.analyze_candidate("c-short", "a2", at(10, seconds=1)), "past_deadline"),
    (lambda s: s.begin_promotion("nope", at(1)), "unknown_candidate"),
    (lambda s: s.begin_promotion("c-short", at(1)), "no_quorum"),
    (lambda s: s.begin_promotion("c-ready", at(30, seconds=1)), "expired"),
    (lambda s: s.begin_promotion("c-gone", at(1)), "expired"),
    (lambda s: s.analyze_candidate("c-gone", "a9", at(1)), "expired"),
    (lambda s: s.record_decision("c-ready", "d1", at(1)), "not_promoting"),
    (lambda s: s.finish_promotion("c-ready", at(1)), "not_promoting"),
])
async def test_refused_operations_change_nothing(store: Store, operation, reason: str) -> None:
    await add(store, "c-ready", analysts=("a1", "a2"))
    await add(store, "c-short", analysts=("a1",), deadline=at(10))
    await add(store, "c-gone", ttl_minutes=1)
    assert await store.sweep_expired(at(2)) == {"expired": 1}    # c-gone
    before = await snapshot(store)
    with pytest.raises(RuleViolation) as info:
        await operation(store)
    assert info.value.reason == reason and info.value.exit_code == 65
    assert await snapshot(store) == before


async def test_a_decision_is_recorded_once_and_promotion_needs_it(store: Store) -> None:
    await promoting(store, "c1", at(5), decision=None)
    with pytest.raises(RuleViolation, match="no decision"):
        await store.finish_promotion("c1", at(5))
    await store.record_decision("c1", "d1", at(5))
    with pytest.raises(RuleViolation, match="already has decision"):
        await store.record_decision("c1", "d2", at(5))
    assert (await store.get_candidate("c1")).decision_id == "d1"  # type: ignore[union-attr]


# -- C4: the sweeps ----------------------------------------------------------------------


async def test_sweep_expired_marks_t3_and_t4_only(store: Store) -> None:
    await add(store, "t3-discovered")                                   # expires 12:30
    await add(store, "t3-analyzing", analysts=("a1", "a2"))
    await add(store, "t4", analysts=("a1",), deadline=at(10))
    await add(store, "in-time", analysts=("a1", "a2"), deadline=at(10))  # quorum: no T4
    assert await store.sweep_expired(at(10)) == {"expired": 0}          # strict deadline
    assert await store.sweep_expired(at(10, seconds=1)) == {"expired": 1}
    assert (await statuses(store))["t4"] == "expired"
    assert await store.sweep_expired(at(30)) == {"expired": 0}          # strict expiry
    assert await store.sweep_expired(at(30, seconds=1)) == {"expired": 3}
    assert set((await statuses(store)).values()) == {"expired"}


@pytest.mark.parametrize(("seconds", "with_decision", "expected"), [
    (61, True, S.PROMOTED),
    (61, False, S.REJECTED),
    (60, True, S.PROMOTING),
    (59, True, S.PROMOTING),
    (59, False, S.PROMOTING),
])
async def test_reconcile_stuck_promoting_after_60_s(
    store: Store, seconds: int, with_decision: bool, expected: S
) -> None:
    await promoting(store, "c1", at(5), decision="d1" if with_decision else None)
    result = await store.reconcile_stuck_promoting(at(5, seconds=seconds))
    assert result == {"reconciled": int(expected is not S.PROMOTING)}
    assert (await store.get_candidate("c1")).status is expected  # type: ignore[union-attr]


async def test_sweep_candidates_runs_both_and_is_remembered(
    db_location: str, store: Store
) -> None:
    assert await store.last_sweep() is None
    await add(store, "old")
    await promoting(store, "stuck", at(5), decision=None)
    assert await store.sweep_candidates(at(31)) == {"expired": 1, "reconciled": 1}
    assert await store.sweep_candidates(at(32)) == {"expired": 0, "reconciled": 0}
    async with await open_store(db_location) as other:      # another process's view
        last = await other.last_sweep()
    assert last is not None
    assert (last.function, last.at, last.result) == (
        "sweepCandidates", at(32), {"expired": 0, "reconciled": 0})


async def test_the_sweeps_do_exactly_what_the_pure_rules_say(store: Store) -> None:
    """300 candidates in random states and times: the set-based SQL expires and
    reconciles exactly the candidates ``rules.expiry_rule``/``reconcile_outcome`` name."""
    rnd = random.Random(5)
    for i in range(300):
        created = T0 + timedelta(seconds=rnd.randrange(0, 1800))
        ttl = rnd.choice([1, 5, 30])
        deadline = created + timedelta(minutes=ttl) - timedelta(seconds=rnd.randrange(0, 60))
        kind = rnd.choice(["idle", "one", "quorum", "promoting", "decided"])
        analysts = {"idle": (), "one": ("a1",)}.get(kind, ("a1", "a2"))
        await add(store, f"c{i}", created=created, analysts=analysts, ttl_minutes=ttl,
                  deadline=deadline)
        if kind in ("promoting", "decided"):
            await store.begin_promotion(f"c{i}", created)
        if kind == "decided":
            await store.record_decision(f"c{i}", f"d{i}", created)
    now = T0 + timedelta(minutes=rnd.randrange(10, 40))
    before = [c async for c in store.iter_candidates()]
    to_expire = {c.id for c in before if rules.expiry_rule(c, now)}
    outcome = {c.id: rules.reconcile_outcome(c, now) for c in before}
    resolved = {cid: s for cid, s in outcome.items() if s is not None}
    assert to_expire and resolved                              # the sample is not trivial
    result = await store.sweep_candidates(now)
    assert result == {"expired": len(to_expire), "reconciled": len(resolved)}
    after = {c.id: c for c in [c async for c in store.iter_candidates()]}
    for c in before:
        want = (S.EXPIRED if c.id in to_expire else resolved.get(c.id, c.status))
        assert after[c.id].status is want, c.id


async def test_every_transition_writes_one_audit_event(store: Store) -> None:
    await add(store, "c1")
    await add(store, "c2", analysts=("a1", "a2"))
    await store.begin_promotion("c2", at(1))
    start = await events(store)
    assert await store.sweep_candidates(at(31)) == {"expired": 1, "reconciled": 1}
    assert await events(store, since=start) == 2
    assert await store.sweep_candidates(at(40)) == {"expired": 0, "reconciled": 0}
    assert await events(store, since=start) == 2


# -- T5, T6, M4 ---------------------------------------------------------------------------------


async def test_promoted_is_never_touched_by_a_sweep(store: Store) -> None:
    done = await promoted(store, "c-done", at(1))
    before = await snapshot(store)
    for minutes in (31, 60 * 24, 60 * 24 * 365):
        assert await store.sweep_candidates(at(minutes)) == {"expired": 0, "reconciled": 0}
    assert await store.get_candidate("c-done") == done
    assert (await snapshot(store))[:2] == before[:2]      # no row, no event changed


async def test_rejected_and_expired_are_kept(store: Store) -> None:
    await add(store, "c-expired")
    await promoting(store, "c-rejected", at(1), decision=None)
    await promoted(store, "c-promoted", at(1))
    await store.sweep_candidates(at(31))
    await store.sweep_candidates(at(60 * 24 * 30))        # a month later: still there
    assert await statuses(store) == {
        "c-expired": "expired", "c-rejected": "rejected", "c-promoted": "promoted"}


async def test_an_expired_candidate_is_never_promoted_whatever_the_order(store: Store) -> None:
    # swept first, then promote: refused
    await add(store, "swept", analysts=("a1", "a2"))
    await store.sweep_expired(at(31))
    with pytest.raises(RuleViolation, match="it is expired"):
        await store.begin_promotion("swept", at(20))       # even with an earlier --now
    # past expires_at but not swept yet: refused as well
    await add(store, "unswept", analysts=("a1", "a2"))
    with pytest.raises(RuleViolation, match="expired at"):
        await store.begin_promotion("unswept", at(31))
    # locked in time, then the sweep: the lock was taken unexpired, the decision decides
    await add(store, "locked", analysts=("a1", "a2"))
    await store.begin_promotion("locked", at(29))
    assert await store.sweep_expired(at(31)) == {"expired": 1}   # only "unswept"
    assert (await store.record_decision("locked", "d1", at(31))).status is S.PROMOTING
    assert (await store.finish_promotion("locked", at(31))).status is S.PROMOTED
    assert await statuses(store) == {"swept": "expired", "unswept": "expired",
                                     "locked": "promoted"}


async def test_a_late_decision_after_the_sweep_rejected_the_promotion_is_refused(
    store: Store
) -> None:
    await promoting(store, "c1", at(1), decision=None)
    assert await store.reconcile_stuck_promoting(at(2, seconds=1)) == {"reconciled": 1}
    with pytest.raises(RuleViolation, match="rejected"):
        await store.record_decision("c1", "d-late", at(3))
    c = await store.get_candidate("c1")
    assert isinstance(c, Candidate) and (c.status, c.decision_id) == (S.REJECTED, None)


async def test_two_processes_promoting_the_same_candidate_one_wins(
    db_location: str, store: Store
) -> None:
    await add(store, "c1", analysts=("a1", "a2"))
    async with await open_store(db_location) as other:
        assert (await other.begin_promotion("c1", at(1))).status is S.PROMOTING
    with pytest.raises(RuleViolation, match="it is promoting"):
        await store.begin_promotion("c1", at(1))
    c = await store.get_candidate("c1")
    assert c is not None and c.promotion_locked_at == at(1)
