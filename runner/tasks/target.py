"""The target checks before work (SPEC L9, E6; issue 15): a misconfigured target must not
strand records, and must never make them uncertain.

Why a check before the first send: a send whose target cannot even be opened used to be
marked in flight first, so a typo in ``--target`` (a missing directory, a symlink, a
read-only directory) turned every prepared record uncertain, never sent and never
reconcilable.  Whatever can be known before a send is checked before any record is marked
in flight; a failure there is an error with its exit code that changes no record and no
file.  A failure *during* a send is still judged by the port's rules (L5).

Why the target is pinned, like the scope: polls read the target, and an explicit
"missing" answer makes a confirmed record ``confirmed_then_missing`` for good.  A typo
that opened (or created) another, empty target would have made every delivered record
missing.  So the store records the identity of the target it delivers to (the adapter's
``target_id()``), and:

* a delivery run (``once``, ``start``, ``DurableWorker.run_cycle``) refuses another target
  with ``TargetMismatch`` (exit 78), and never creates a target for a store that has one;
* a poll never creates a target; an absent, unreadable or foreign target, or one that is
  not the pinned one, is a failed read (poll health), never an explicit missing; and a
  target the store has not pinned yet may report snapshots but not a missing.

A store made before pinning (schema v5 and older) pins the first target a delivery run
gives it.  That is safe when the store has never sent anything: no record can have been
delivered elsewhere.  A store that has sent before could be given a typo, so then runner
never creates a target for it (the target must exist already), and if the store has
confirmed records, the target must hold at least one of a sample of them (read only,
before anything is written to it) or it is refused as another target (78).  What this
cannot tell apart: a pre-pinning target that holds none of the sampled records because
all of them were deleted there, which is refused (an operator then sees why), and a store
whose sends were all uncertain, which pins the existing target it is given.

An adapter without an identity (``target_id`` absent or None) cannot be pinned: it is
trusted to be the store's own, as before pinning existed, so users' adapters keep working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.clock import Clock
from runner.errors import RunnerError, TargetAbsent, TargetMismatch, TargetUnavailable
from runner.leads.port import CRMRecordPort, Snapshot, TargetError
from runner.leads.states import LeadState

if TYPE_CHECKING:
    from runner.store import TargetPins

log = logging.getLogger("runner.target")

#: confirmed records read back from a pre-pinning target before it is pinned
ADOPTION_SAMPLE = 20
#: states that prove a send may have left: a store with such a record has delivered
SENT_STATES = (LeadState.IN_FLIGHT, LeadState.UNCERTAIN, LeadState.CONFIRMED,
               LeadState.CONFIRMED_THEN_MISSING)


@dataclass(frozen=True)
class ReadCheck:
    """What a poll may believe of the target.

    ``failure``: a reason every read of the pass fails with (the target is absent,
    unreadable, foreign or not the pinned one); the adapter is not asked at all.
    ``trusted``: the target is the store's own, so an explicit missing is believed."""

    failure: str | None = None
    trusted: bool = True


TRUSTED = ReadCheck()


def _short(target_id: str) -> str:
    return target_id[:12]


def _apart(pinned: str, found: str) -> tuple[str, str]:
    """Two different ids, each cut to 12 characters unless that makes them look the same:
    then both cut where they first differ, and a little beyond (never the same text
    twice in one refusal)."""
    if pinned[:12] != found[:12]:
        return pinned[:12], found[:12]
    at = next((i for i, (a, b) in enumerate(zip(pinned, found, strict=False)) if a != b),
              min(len(pinned), len(found)))
    return pinned[: at + 4], found[: at + 4]


def _as_runner_error(exc: Exception, doing: str) -> RunnerError:
    """An adapter's failure in a check as one of ours: the run stops with its code."""
    if isinstance(exc, RunnerError) and not isinstance(exc, TargetError):
        return exc
    detail = exc.message if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
    return TargetUnavailable(f"the target failed its check while {doing}: {detail}")


async def _identify(port: CRMRecordPort, doing: str) -> str | None:
    try:
        return await port.identify()
    except Exception as exc:  # noqa: BLE001 - any failure stops the run, changing nothing
        raise _as_runner_error(exc, doing) from None


async def _prepare(port: CRMRecordPort, *, create: bool) -> None:
    try:
        await port.prepare_writes(create=create)
    except Exception as exc:  # noqa: BLE001 - any failure stops the run, changing nothing
        raise _as_runner_error(exc, "checking it can be written") from None


async def _has_sent(store: TargetPins) -> bool:
    counts = (await store.summary()).counts
    return any(counts.get(state, 0) for state in SENT_STATES)


async def _holds_store_records(store: TargetPins, port: CRMRecordPort) -> None:
    """Before a pre-pinning store adopts a target: if it has confirmed records, the target
    must hold at least one of a sample of them (read only; nothing is written)."""
    sample = await store.poll_page(ADOPTION_SAMPLE)
    if not sample:
        return
    try:
        seen = await port.observe_status([t.write_id for t in sample])
    except Exception as exc:  # noqa: BLE001 - cannot tell: refuse, changing nothing
        raise _as_runner_error(exc, "reading it to check it holds this store's records") \
            from None
    if not any(isinstance(seen.get(t.write_id), Snapshot) for t in sample):
        raise TargetMismatch(
            "the target holds none of this store's confirmed records (the store delivered "
            "before targets were pinned; give it the target it delivered to); nothing was "
            "changed")


async def check_for_writes(store: TargetPins, port: CRMRecordPort, clock: Clock) -> None:
    """Before any record is marked in flight: the target opens, can be written and is the
    store's own (pinning it if the store has none yet).  Raises with an exit code and
    changes nothing otherwise."""
    pinned = await store.pinned_target()
    if pinned is not None:
        if not port.pinnable:
            raise TargetMismatch(f"the store is pinned to target {_short(pinned)}, and this "
                                 "adapter names no target; nothing was changed")
        try:
            found = await _identify(port, "reading its identity")
        except TargetAbsent as exc:
            raise TargetMismatch(f"the store is pinned to target {_short(pinned)}: "
                                 f"{exc.message}; nothing was changed") from None
        if found != pinned:
            was, now = _apart(pinned, found) if found else (_short(pinned), "no identity")
            raise TargetMismatch(f"the store is pinned to target {was}, not to this one "
                                 f"({now}); nothing was changed")
        await _prepare(port, create=False)
        return
    sent = port.pinnable and await _has_sent(store)
    if sent:
        await _holds_store_records(store, port)
    # a store that has sent never gets a new target: the one it sent to exists
    await _prepare(port, create=not sent)
    found = await _identify(port, "reading its identity")
    if found is None:
        return  # not pinnable: trusted, as before pinning
    now_pinned = await store.pin_target(found, clock.now())
    if now_pinned != found:  # another process pinned another target meanwhile
        was, now = _apart(now_pinned, found)
        raise TargetMismatch(f"the store is pinned to target {was}, not to "
                             f"this one ({now}); nothing was changed")
    log.info("target pinned: %s", _short(found),
             extra={"action": "target.pinned", "target_id": found})


async def check_for_reads(store: TargetPins, port: CRMRecordPort) -> ReadCheck:
    """Before a poll pass: whether reads may go to the target, and whether an explicit
    missing from it is believed.  Never creates a target; never raises for the target."""
    pinned = await store.pinned_target()
    if not port.pinnable:
        return TRUSTED if pinned is None else ReadCheck("target_mismatch", trusted=False)
    try:
        found = await port.identify()
    except TargetAbsent:
        return ReadCheck("target_absent", trusted=False)
    except Exception:  # noqa: BLE001 - unreadable or foreign: a failed read, not deletion
        return ReadCheck("target_unavailable", trusted=False)
    if found is None:
        return TRUSTED if pinned is None else ReadCheck("target_mismatch", trusted=False)
    if pinned is None:
        return ReadCheck(trusted=False)  # snapshots yes; a missing only once pinned
    if found != pinned:
        return ReadCheck("target_mismatch", trusted=False)
    return TRUSTED
