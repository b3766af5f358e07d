"""Child: ``runner poll-status`` on PostgreSQL, stopped inside its pass's transaction.

Usage: python -m tests.procs.pg_stopped_poll RUNNER-ARGS...
Runs ``runner.cli.main(RUNNER-ARGS)`` (a ``poll-status`` command line) with one change:
once the poll pass's transaction has written its observations and taken the poll-health
lock, the process says ``holding`` on stdout and stops itself with SIGSTOP, as Ctrl-Z or
a debugger would stop it there.  The test resumes it (SIGCONT) and reads how it ends.
"""

from __future__ import annotations

import os
import signal
import sys

from runner.cli import main
from runner.io.postgres.leads import LeadHooks

_lock_poll_health = LeadHooks._lock_poll_health


async def _stop_inside(self: LeadHooks) -> None:
    await _lock_poll_health(self)
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    LeadHooks._lock_poll_health = _stop_inside  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
