"""Child: N attempts of a second worker through the CLI's own ``main()``, each a full
``once`` or ``start`` (open the store, try the lock), while another process holds it.

Usage: python -m tests.procs.lock_attempts N DB SCOPE TARGET GO_FILE
Waits for GO_FILE (so several children contend at once), prints one JSON list of results.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from runner.cli import main
from tests.procs.accept_many import wait_for


def attempt(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


if __name__ == "__main__":
    n, db, scope, target, go = int(sys.argv[1]), *sys.argv[2:6]
    wait_for(go)
    paths = ["--db", db, "--scope", scope, "--target", target]
    results = [attempt(["once", *paths] if i % 2 else
                       ["start", *paths, "--cycles", "1", "--interval", "0"])
               for i in range(n)]
    print(json.dumps(results))
