"""What is durable: the replication guarantee a store runs under (issue 30, SPEC E8).

An event is acknowledged after its commit; what that commit survives depends on the
store.  A SQLite store is a single file with no replication.  A PostgreSQL store is as
durable as the server's configuration makes a commit:

* **single**: no standby streams from the server (as far as runner's role can see): an
  acknowledged event lives on this server's disk, and there is nothing to fail over to.
* **synchronous**: ``synchronous_standby_names`` names standbys and ``synchronous_commit``
  is ``remote_write``, ``on`` or ``remote_apply``: a commit returns only once the number
  of standbys it names has the commit, so a promoted standby has every acknowledged event.
  While fewer of them are connected, commits wait (nothing is acknowledged then).
* **asynchronous**: standbys stream, but a commit does not wait for them (no
  ``synchronous_standby_names``, or ``synchronous_commit`` ``local`` or ``off``): an event
  acknowledged just before the primary fails can be missing on the promoted standby.
* **standby**: runner is connected to a standby (read-only commands only).
* **unknown**: the server did not say (a role that may not read the settings).

What a plain role sees (no superuser, no ``pg_read_all_stats``): the settings
(``SHOW synchronous_standby_names``, ``synchronous_commit``) and one row of
``pg_stat_replication`` per WAL sender with its ``application_name``, every other column
NULL.  That is enough to count the connected standbys and those the server waits for by
name; whether each one is streaming or still catching up is visible only to a privileged
role, so a plain role counts every sender it sees.  A provider that replicates below
PostgreSQL (storage-level replication of a managed service) shows no standby at all:
runner then says ``single``, and the provider's own promise is what holds.

The decision is pure (:func:`classify`, from the facts the store read); the store adapter
reads the facts (``Store.replication``).  ``--require-synchronous-replication`` makes
intake refuse events unless :attr:`Replication.synchronous` (:class:`SynchronousIntake`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from runner.errors import NotSynchronous

if TYPE_CHECKING:
    from runner.ids import WriteId
    from runner.leads.models import LeadEvent
    from runner.storedata import AcceptItem, AcceptOutcome

Mode = Literal["single_file", "single", "synchronous", "asynchronous", "standby", "unknown"]
#: ``synchronous_commit`` levels at which a commit waits for the synchronous standbys
WAITING_LEVELS = ("remote_write", "on", "remote_apply")
#: ``FIRST 2 (a, b)``, ``ANY 1 (a, b)``, ``2 (a, b)``
_NUMBERED = re.compile(r"^(?:(first|any)\s+)?(\d+)\s*\((.*)\)$", re.IGNORECASE | re.DOTALL)

log = logging.getLogger("runner.replication")


@dataclass(frozen=True)
class Sender:
    """One row of ``pg_stat_replication``: ``state`` and ``sync_state`` are None for a
    role that may not see them."""

    name: str
    state: str | None
    sync_state: str | None


@dataclass(frozen=True)
class Replication:
    """The guarantee, in a few fields and one sentence (``detail``)."""

    mode: Mode
    #: standbys streaming from the server, as far as runner's role sees (None: unknown)
    standbys: int | None
    #: how many standbys a commit waits for (0: none)
    synchronous_standbys: int
    #: how many of the standbys a commit may wait for are connected (None: unknown)
    synchronous_connected: int | None
    synchronous_commit: str | None
    detail: str

    @property
    def synchronous(self) -> bool:
        """Every acknowledged commit is on enough standbys (and commits do not wait for
        standbys that are not there)."""
        return self.mode == "synchronous" and (
            self.synchronous_connected is None
            or self.synchronous_connected >= self.synchronous_standbys)

    @property
    def at_risk(self) -> bool:
        """An acknowledgement can be lost at a failover (or, with ``synchronous_commit``
        off, at this server's crash): what start-up warns about."""
        return self.mode in ("asynchronous", "unknown") or self.synchronous_commit == "off"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "standbys": self.standbys,
                "synchronous_standbys": self.synchronous_standbys,
                "synchronous_connected": self.synchronous_connected,
                "synchronous_commit": self.synchronous_commit, "detail": self.detail}


SINGLE_FILE = Replication("single_file", 0, 0, 0, None, "a single file, no replication")


def parse_standby_names(text: str) -> tuple[int, list[str]]:
    """``synchronous_standby_names`` as (how many a commit waits for, the names): ``''``
    is (0, []), ``a, b`` is (1, [a, b]) (FIRST 1), ``ANY 2 (a, b, c)`` is (2, [a, b, c]).
    Names are compared without case (as the server does); ``*`` is any standby."""
    text = text.strip()
    if not text:
        return 0, []
    match = _NUMBERED.match(text)
    number, names = (int(match.group(2)), match.group(3)) if match else (1, text)
    return number, [name.strip().strip('"').lower() for name in names.split(",")
                    if name.strip()]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def classify(*, names: str, commit: str, in_recovery: bool,
             senders: Sequence[Sender] | None) -> Replication:
    """The guarantee from the server's facts: its ``synchronous_standby_names``, the
    session's ``synchronous_commit``, whether it is in recovery, and the WAL senders this
    role sees (None: it may not read ``pg_stat_replication``)."""
    if in_recovery:
        return Replication("standby", None, 0, None, commit,
                           "this server is a standby (read-only): it replicates from a "
                           "primary and acknowledges no event itself")
    wanted, listed = parse_standby_names(names)
    standbys = None
    matching = None
    if senders is not None:
        seen = [s for s in senders if s.state is None or s.state in ("streaming", "catchup")]
        standbys = len(seen)
        # the standbys a commit can wait for: named (or ``*``) and, where the role sees
        # it, streaming (a standby still catching up is not synchronous yet)
        matching = sum(1 for s in seen if (s.state in (None, "streaming"))
                       and ("*" in listed or s.name.lower() in listed))
    off = ("; synchronous_commit is off: the last commits can be lost even if this server "
           "only crashes" if commit == "off" else "")
    if wanted and commit in WAITING_LEVELS:
        if matching is not None and matching < wanted:
            detail = (f"synchronous replication, but of the {_plural(wanted, 'standby')} "
                      f"every commit waits for, only {matching} "
                      f"{'is' if matching == 1 else 'are'} connected: commits wait until "
                      "enough are")
        else:
            detail = (f"synchronous replication: every commit waits until "
                      f"{_plural(wanted, 'standby')} {'has' if wanted == 1 else 'have'} it "
                      f"(synchronous_commit {commit}"
                      + (f", {matching} connected)" if matching is not None else ")"))
        return Replication("synchronous", standbys, wanted, matching, commit, detail)
    if standbys is None:
        why = (f"synchronous_commit is {commit}" if wanted else
               "no synchronous_standby_names")
        return Replication("unknown", None, 0, None, commit,
                           f"not synchronous ({why}), and this role may not see whether a "
                           f"standby streams from the server{off}")
    if standbys == 0:
        return Replication("single", 0, 0, 0 if wanted else None, commit,
                           "a single server: no standby streams from it (as far as "
                           "runner's role sees), so an acknowledged event is as durable "
                           f"as this server's disk{off}")
    why = (f"synchronous_standby_names is set, but synchronous_commit is {commit}: "
           "commits do not wait for a standby" if wanted else
           "no synchronous_standby_names: commits do not wait for a standby")
    return Replication("asynchronous", standbys, 0, matching if wanted else None, commit,
                       f"asynchronous replication to {_plural(standbys, 'standby')} "
                       f"({why}): an event acknowledged just before this server fails can "
                       f"be missing on the standby promoted in its place{off}")


def announce(replication: Replication) -> None:
    """Log the guarantee a long-running intake starts under, and warn once when an
    acknowledgement can be lost (``start``, ``serve``; again after a reconnect)."""
    if replication.at_risk:
        log.warning("an acknowledged event can be lost: %s (synchronous replication closes "
                    "that: synchronous_standby_names on the primary; "
                    "--require-synchronous-replication refuses events without it)",
                    replication.detail,
                    extra={"action": "replication.at_risk",
                           "replication": replication.mode,
                           "standbys": replication.standbys})


def refusal(replication: Replication) -> NotSynchronous:
    """The one line ``--require-synchronous-replication`` refuses an event with."""
    return NotSynchronous(
        "not taking events: --require-synchronous-replication, and replication is not "
        f"synchronous ({replication.mode}: {replication.detail}); nothing was stored")


class ReplicationReader(Protocol):
    async def replication(self) -> Replication:
        """The guarantee the store runs under now (one small read; nothing is written)."""
        ...


class IntakeWrites(ReplicationReader, Protocol):
    """An intake store (``runner.store.IntakeStore``) that says how it replicates."""

    async def accept(self, event: LeadEvent, canonical: str, write_id: WriteId,
                     now: datetime) -> AcceptOutcome: ...

    async def accept_many(self, items: Sequence[AcceptItem], now: datetime
                          ) -> list[AcceptOutcome]: ...


class SynchronousIntake:
    """An intake store that refuses every group commit unless replication is synchronous
    (read again before each commit: a failover or a changed setting is seen at the next
    one).  The refusal (``NotSynchronous``, exit 78) stores nothing."""

    def __init__(self, store: IntakeWrites) -> None:
        self._store = store

    async def _check(self) -> None:
        replication = await self._store.replication()
        if not replication.synchronous:
            raise refusal(replication)

    async def accept(self, event: LeadEvent, canonical: str, write_id: WriteId,
                     now: datetime) -> AcceptOutcome:
        await self._check()
        return await self._store.accept(event, canonical, write_id, now)

    async def accept_many(self, items: Sequence[AcceptItem], now: datetime
                          ) -> list[AcceptOutcome]:
        await self._check()
        return await self._store.accept_many(items, now)
