"""Child: a worker frozen in the middle of a commit, as SIGSTOP (or Ctrl-Z) leaves one.

Usage: python -m tests.procs.stopped_worker DB
Takes the worker lock of DB's store (writing its pid, as a worker does), opens a write
transaction on the store (``BEGIN IMMEDIATE``: SQLite's write lock), says ``holding`` on
stdout, then stops itself with SIGSTOP.  The test resumes (SIGCONT) or kills it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys

from runner.io.filelock import FileLock, lock_path_for

if __name__ == "__main__":
    db = sys.argv[1]
    lock = FileLock(lock_path_for(db))
    lock.acquire()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    conn.execute("ROLLBACK")
