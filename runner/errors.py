"""One error root for runner, with categories that map to exit codes (SPEC K8).

::

    RunnerError                      exit code
    ├── UsageError                   2   bad command line, --db and --target the same file
    ├── BadInputError                65  invalid record or scope file, outside scope, conflict
    │   ├── RuleViolation            65  a domain rule refused the operation
    │   └── OutboxPruned             65  a read of the outbox below its prune floor
    ├── StoreNotFound                66  a read-only command named a store that does not exist,
    │                                    or a PostgreSQL database that does not exist
    ├── SimulatedCrash               73  a --fault crash-* fired (where os._exit is not used)
    ├── StoreError                   74  the store could not be read or written (I/O, full, corrupt,
    │   │                                server unreachable or the connection dropped)
    │   ├── StoreFull                74  no space left for the store: the change was not written
    │   ├── StoreUnavailable         74  the store's server cannot be reached or the session
    │   │   │                            dropped: what a long-running command waits out and
    │   │   │                            reconnects through
    │   │   ├── StoreUnreachable     74  no PostgreSQL host took a session: refused, unknown,
    │   │   │                            timed out, not taking connections (starting, stopping)
    │   │   ├── ConnectionLost       74  the PostgreSQL session ended under a command: the
    │   │   │                            server died, restarted or ended the session
    │   │   └── StoreReadOnly        74  the PostgreSQL server is read-only (a standby), or no
    │   │                                host of a multi-host DSN accepts writes
    │   ├── LockLost                 74  the worker lock's database session ended under us
    │   └── TargetUnavailable        74  the --target cannot be opened, read or written, or is
    │       │                            not a target (a foreign SQLite file, not SQLite at all)
    │       ├── TargetAbsent         74  no target there, where one must already exist
    │       └── PollFailed           74  poll-status: every status read of the pass failed (the
    │                                    pass is recorded and its summary printed first)
    ├── LockHeld                     75  another live worker holds the lock
    │   └── StoreBusy                75  the store stayed locked longer than the busy timeout
    ├── UnsafeLocation               77  network filesystem, symlink, directory others can write
    ├── AccessDenied                 77  the database refused us: authentication or permission
    └── ConfigMismatch               78  the store's pinned scope differs from --scope
        ├── SchemaTooNew             78  the store was written by a newer runner
        ├── TargetMismatch           78  the target is not the one pinned into the store (another
        │                                target, or none at that path for a pinned store)
        └── NotSynchronous           78  --require-synchronous-replication, and the store's
                                         replication is not synchronous: no event taken

A refusal (exit 65: ``BadInputError`` and ``RuleViolation``) also answers on stdout, as
every command answers: one JSON line ``{"result": "refused", "reason", …}`` (``refusal``
below; ``accept`` answers its own ``rejected`` line).

The target errors of this table are the *checks before work* (``runner.tasks.target``):
a delivery run checks that its target opens, can be written and is the store's own before
any record is marked in flight, and a failure there stops the run with its exit code,
having changed no record and no file.  A symlinked target path or an unsafe directory is
``UnsafeLocation`` (77), as for the store.

Errors of a send are not here: they belong to the port (``runner.leads.port``) and become record
states, never exit codes.  Driver exceptions (sqlite3, asyncpg, OSError) are translated
into these where they enter, with ``raise ... from exc``, so no raw driver error reaches
the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def leaves(error: BaseException) -> list[BaseException]:
    """The errors an exception group holds, however deeply nested, in order (an error
    that is not a group: itself).  A task group wraps what its tasks raised in a group;
    the one error boundary (``runner.cli``) and the loop read through it with this."""
    if not isinstance(error, BaseExceptionGroup):
        return [error]
    return [leaf for inner in error.exceptions for leaf in leaves(inner)]


class RunnerError(Exception):
    """Root of every error runner raises on purpose."""

    exit_code: int = 1
    reason: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(RunnerError):
    exit_code = 2
    reason = "usage"


class BadInputError(RunnerError):
    """Input that is not a valid, in-scope record (or scope file).

    ``reason`` is a short stable token for the JSON answer (``invalid_json``,
    ``invalid_record``, ``scope_mismatch``, ``conflict``, ``unreadable`` …).
    """

    exit_code = 65

    def __init__(self, message: str, *, reason: str = "invalid_record",
                 detail: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        #: fields the refusal's JSON line on stdout carries besides ``result`` and
        #: ``reason`` (identifiers only: never a contact field)
        self.detail: Mapping[str, Any] = detail or {}


class RuleViolation(BadInputError):
    """A well-formed request that a domain rule refuses."""

    def __init__(self, message: str, *, reason: str = "rule_violation",
                 detail: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, reason=reason, detail=detail)


def refusal(exc: BadInputError) -> dict[str, Any]:
    """The JSON line a refused command prints on stdout (exit 65): ``{"result":
    "refused", "reason", …detail}``.  ``accept`` answers its own ``rejected`` line."""
    return {"result": "refused", "reason": exc.reason, **exc.detail}


class OutboxPruned(BadInputError):
    """A read of the outbox from a sequence below its prune floor: those events were
    exported and pruned (``runner outbox prune``); nothing is returned rather than a
    silently shorter stream."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="pruned")


class StoreNotFound(RunnerError):
    exit_code = 66
    reason = "store_not_found"


class SimulatedCrash(RunnerError):
    exit_code = 73
    reason = "simulated_crash"


class StoreError(RunnerError):
    exit_code = 74
    reason = "store_error"


class StoreFull(StoreError):
    """SQLite ran out of space (``SQLITE_FULL``, or an I/O error on a full device).  The
    failing transaction was rolled back: nothing of it was written."""

    reason = "store_full"


class StoreUnavailable(StoreError):
    """The store's server could not be reached, or the session to it dropped: the
    connection was refused or lost, a statement or a connect did not answer in time, or
    the server is read-only now (a standby, a demoted primary).  A condition that may pass
    by itself: ``start``, ``worker`` and ``job`` reconnect through it for at most
    ``--reconnect-max`` seconds (``runner.tasks.reconnect``); a one-shot command exits 74.
    Whether the statement that failed was applied is unknown; every caller treats it that
    way (an in-flight mark may have committed: recovery makes such a record uncertain)."""

    reason = "store_unavailable"


class StoreUnreachable(StoreUnavailable):
    """No PostgreSQL host gave runner a session: the connection was refused, the host is
    unknown or did not answer in time, or the server is not taking connections (starting
    up, shutting down).  Nothing was read or written."""

    reason = "store_unreachable"


class ConnectionLost(StoreUnavailable):
    """The PostgreSQL session ended under a command (the server was killed, restarted or
    shut down, or it ended the session: terminated, idle in a transaction too long).  An
    open transaction was rolled back by the server; a COMMIT whose answer was lost may or
    may not have committed, which is why every step of runner is safe to run again."""

    reason = "connection_lost"


class StoreReadOnly(StoreUnavailable):
    """The PostgreSQL server takes no writes: a standby (a DSN naming it alone, or a
    failover not finished yet), or no host of a multi-host DSN is writable.  Nothing was
    written."""

    reason = "store_read_only"


class LockLost(StoreError):
    """The session that held the PostgreSQL worker lock is gone: stop before sending."""

    reason = "lock_lost"


class TargetUnavailable(StoreError):
    """The target cannot be used: it does not open, cannot be read or written, or is not a
    target at all.  Raised by the checks before work, never by a send (a send's failure
    becomes a record state)."""

    reason = "target_unavailable"


class TargetAbsent(TargetUnavailable):
    """No target at the given location, where one must already exist (reads never create
    a target, nor does a run for a store that has delivered before)."""

    reason = "target_absent"


class PollFailed(TargetUnavailable):
    """``poll-status`` read nothing: every status read of its pass failed (an absent,
    unreadable or foreign target, or the target's own read errors).  The pass itself is
    recorded (poll health) and its summary printed before the command exits with this,
    so cron or a supervisor notices.  A pass with nothing to poll is not a failure."""

    reason = "poll_failed"


class LockHeld(RunnerError):
    exit_code = 75
    reason = "locked"

    def __init__(self, message: str, *, holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


class StoreBusy(LockHeld):
    reason = "store_busy"


class UnsafeLocation(RunnerError):
    exit_code = 77
    reason = "unsafe_location"


class AccessDenied(RunnerError):
    """The database server refused the user: a failed login or a missing privilege."""

    exit_code = 77
    reason = "access_denied"


class ConfigMismatch(RunnerError):
    exit_code = 78
    reason = "scope_mismatch"


class SchemaTooNew(ConfigMismatch):
    reason = "schema_too_new"


class TargetMismatch(ConfigMismatch):
    """The target is not the one pinned into the store (SPEC L9): like the scope, the
    target a store delivers to is pinned, and another one is refused, changing nothing."""

    reason = "target_mismatch"


class TargetOwned(TargetMismatch):
    """The target keeps batch marks of another store (SPEC E8): this store may be new,
    emptied or re-created; nothing is sent to it until an operator adopts it
    (``runner target adopt``)."""

    reason = "target_owned"


class NotSynchronous(ConfigMismatch):
    """``--require-synchronous-replication`` refused an event: the store does not run
    under synchronous replication (a single server, asynchronous standbys, too few
    synchronous standbys connected, or it cannot tell).  Nothing was stored; the webhook
    answers 503."""

    reason = "not_synchronous"
