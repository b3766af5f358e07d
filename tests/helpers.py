"""Shared helpers: synthetic fixtures, and running the CLI in process (``run_main``: exit
codes and output shapes) or as a real process (``run_cli``, ``Child``: where the point is a
process)."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN = str(ROOT / "run.py")

SCOPE: dict[str, str] = {
    "tenant_id": "tenant-synthetic-1",
    "account_id": "account-synthetic-1",
    "page_id": "page-synthetic-1",
    "form_id": "form-synthetic-1",
}

CANARY = "canary-alias-7f3e"  # a contact alias that must never appear in any output


def event(i: int | str = 1, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        **SCOPE,
        "source": "meta",
        "source_lead_id": f"lead-{i}",
        "synthetic": True,
        "contact_alias": f"alias-{i}",
    }
    doc.update(overrides)
    return doc


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def run_cli(
    *args: str | Path,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python run.py ARGS`` as a child process and return what it did."""
    full_env = {**os.environ, **(env or {})}
    data = input.decode() if isinstance(input, bytes) else input
    return subprocess.run(
        [sys.executable, RUN, *map(str, args)],
        input=data,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


#: what makes a command line leave the process on purpose (``os._exit(73)``), or block
#: a thread until a test releases it: only a real process can run those
_PROCESS_ONLY_FAULTS = ("crash", "hang")
_PROCESS_ONLY_ENV = ("RUNNER_CRASH_AT",)


def needs_a_process(argv: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether a command line crashes (``os._exit``) or hangs on purpose, or is a ``start``
    that runs: its sweep task may be cancelled while its store is still opening, which
    leaves an aiosqlite thread behind that only a process exit ends (found when ``start``
    ran in process; see the branch's report)."""
    faults = [value for option, value in itertools.pairwise(argv)
              if option == "--fault"]
    return ((bool(argv) and argv[0] == "start")
            or any(value.startswith(_PROCESS_ONLY_FAULTS) for value in faults)
            or any(name in {**os.environ, **(env or {})} for name in _PROCESS_ONLY_ENV))


def run_command(
    *args: str | Path, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """``run_main`` in process, or ``run_cli`` in a real process for a command line that
    crashes or hangs on purpose: a test arranges in process and acts in a process."""
    if needs_a_process([str(a) for a in args], env):
        return run_cli(*args, env=env, **kw)
    return run_main(*args, env=env, **kw)


def run_main(
    *args: str | Path,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
    guard: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``runner.cli.main(ARGS)`` in this process and return what it did, in the shape
    ``run_cli`` returns: the same exit code, stdout and stderr as ``python run.py ARGS``,
    without an interpreter start-up.

    ``main`` calls ``anyio.run`` itself: from a test with a running event loop it runs in
    a worker thread (the loop is blocked meanwhile, as it is by ``run_cli``).  ``input``
    becomes ``sys.stdin`` (for ``--record -``); ``env`` and ``cwd`` apply for the call
    only.  The ``runner`` logger is restored afterwards, so nothing leaks into the next
    test.  A command line that crashes or hangs on purpose is refused: use ``run_cli``
    (``guard=False`` lets through one that a test knows is refused as a usage error).
    """
    import asyncio
    import contextlib
    import io
    import logging
    import threading

    from runner.cli import main

    argv = [str(a) for a in args]
    if guard and needs_a_process(argv, env):
        raise AssertionError(f"{argv} crashes or hangs on purpose: use run_cli")
    data = input.encode() if isinstance(input, str) else input
    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("runner")
    saved_logger = (logger.handlers[:], logger.level, logger.propagate)
    saved_env = {name: os.environ.get(name) for name in env or {}}
    saved_cwd = os.getcwd()
    saved_stdin = sys.stdin
    result: list[int] = []

    def call() -> None:
        result.append(main(argv))

    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        if data is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                call()
            else:
                thread = threading.Thread(target=call, name="run_main")
                thread.start()
                thread.join(timeout)
                assert not thread.is_alive(), f"main{argv} did not return in {timeout} s"
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        logger.handlers[:] = saved_logger[0]
        logger.setLevel(saved_logger[1])
        logger.propagate = saved_logger[2]
    return subprocess.CompletedProcess(["runner", *argv], result[0], out.getvalue(),
                                       err.getvalue())


def cli(*argv: str | Path) -> tuple[int, str, str]:
    """``runner.cli.main`` in process, as ``(exit code, stdout, stderr)``, whatever the
    command (``start`` included: its tasks close their connections when cancelled)."""
    done = run_main(*argv, guard=False)
    return done.returncode, done.stdout, done.stderr


def digest(path: Path) -> str:
    """A file's SHA-256: "left byte for byte as it was" is an equal digest."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def last_json(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no JSON on stdout"
    return json.loads(lines[-1])


def ndjson(stdout: str) -> list[Any]:
    """Every line of an NDJSON answer (``status --records``), parsed, in order."""
    return [json.loads(line) for line in stdout.splitlines()]


def status_records(db: str | Path, *extra: str) -> list[dict[str, Any]]:
    """Every record, in accept order, through ``runner status --records`` (NDJSON): the
    full list the default ``status`` no longer carries (issue 21)."""
    proc = run_main("status", "--db", db, "--records", *extra)
    assert proc.returncode == 0, proc.stderr
    return ndjson(proc.stdout)


async def worker_records(worker: Any) -> list[dict[str, Any]]:
    """Every record, in accept order, through ``DurableWorker.records()``."""
    return [record async for record in worker.records()]


def dump_store(location: str | Path) -> list[str]:
    """A logical dump of a store on either backend, to prove that nothing changed."""
    from tests import pg

    if pg.is_pg(location):
        return pg.dump(str(location))
    return dump_db(Path(location))


def store_exists(location: str | Path) -> bool:
    from tests import pg

    if pg.is_pg(location):
        return pg.exists(str(location))
    return Path(location).exists()


def dump_db(path: Path) -> list[str]:
    """A logical dump of a SQLite file, to prove that nothing changed."""
    if not path.exists():
        return ["<absent>"]
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return [f"user_version={version}", *conn.iterdump()]
    finally:
        conn.close()


def read_store(location: str | Path) -> tuple[Any, list[Any]]:
    """(summary, records) of a store on either backend, read through the library."""
    from runner.io.stores import open_store
    from tests import pg

    async def read() -> tuple[Any, list[Any]]:
        async with await open_store(str(location), create=False) as store, store.reading():
            return await store.summary(), [row async for row in store.iter_records()]

    return pg.run(read)


class Child:
    """A CLI child process whose stdout/stderr lines are collected as they arrive, so a
    test can wait for a line (an event) instead of sleeping."""

    def __init__(self, *args: str | Path, env: dict[str, str] | None = None,
                 preexec_fn: Any = None, stdin: bool = False) -> None:
        import threading

        self.proc = subprocess.Popen(
            [sys.executable, RUN, *map(str, args)], env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            preexec_fn=preexec_fn,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 30, what: str = "a line") -> None:
        """Wait until ``predicate(self)`` is true (re-checked whenever a line arrives)."""
        import time

        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}: out={self.out} "
                                         f"err={self.err}")
                self._changed.wait(min(left, 0.2))

    def wait_err(self, text: str, timeout: float = 30) -> None:
        self.wait_for(lambda c: any(text in line for line in c.err), timeout, repr(text))

    def wait_out_lines(self, n: int, timeout: float = 30) -> None:
        self.wait_for(lambda c: len(c.out) >= n, timeout, f"{n} stdout lines")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        self._close()
        return code

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def _close(self) -> None:
        self.close_stdin()
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        """Make sure the child is gone (a test's ``finally``)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._close()


def wait_path(path: Path, child: Child | None = None, timeout: float = 30) -> None:
    """Wait until a file exists (a hang fault announcing itself), polling its directory."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        if child is not None and child.proc.poll() is not None:
            raise AssertionError(f"child exited early: out={child.out} err={child.err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.01)


class CliStore:
    """A store with its scope and target files, driven through the CLI the way a user
    drives it: every command in process (``run_main``), except one that crashes or hangs
    on purpose, which runs as a real process (``run_command``).  The ``cli_store``
    fixture makes one per backend."""

    def __init__(self, workdir: Path, scope_file: Path, db: str | Path) -> None:
        self.dir = workdir
        self.scope = scope_file
        self.db = str(db)
        self.target = workdir / "target.db"

    def run(self, command: str, *extra: str | Path, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """``COMMAND --db --scope --target EXTRA`` (no ``--target`` for accept)."""
        target: list[str | Path] = [] if command == "accept" else ["--target", self.target]
        return run_command(command, "--db", self.db, "--scope", self.scope, *target, *extra,
                           env=env)

    def accept(self, *ids: int, env: dict[str, str] | None = None, ok: bool = True,
               ) -> subprocess.CompletedProcess[str]:
        """Accept ``event(i)`` for each id (with ``ok``, each must exit 0); the last run."""
        proc = None
        for i in ids:
            proc = self.run("accept", "--record", write_json(self.dir / f"e{i}.json", event(i)),
                            env=env)
            assert not ok or proc.returncode == 0, proc.stderr
        assert proc is not None
        return proc

    def once(self, *extra: str | Path, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
        return self.run("once", *extra, env=env)

    def cli(self, command: str, *extra: str | Path, code: int = 0) -> Any:
        """Run a command that must exit ``code`` (0 unless said); its last JSON line."""
        proc = self.run(command, *extra)
        assert proc.returncode == code, proc.stderr
        return last_json(proc.stdout)

    def status(self) -> Any:
        proc = run_main("status", "--db", self.db)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def all_records(self) -> list[dict[str, Any]]:
        """Every record in accept order (``status --records``)."""
        return status_records(self.db)

    def records(self) -> dict[str, Any]:
        return {r["source_lead_id"]: r for r in self.all_records()}

    def confirmed(self, n: int) -> None:
        """n confirmed records, made in process through the library."""
        from runner import DurableWorker
        from runner.io.synthetic_target import SyntheticTarget
        from tests import pg

        async def go() -> None:
            target = SyntheticTarget(str(self.target))
            async with DurableWorker(self.db, SCOPE, target) as worker:
                for i in range(n):
                    await worker.accept(event(i))
                assert (await worker.run_cycle()).confirmed == n
            target.close()

        pg.run(go)  # on a loop of its own: callable from sync and async tests


def outbox_events(location: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Every outbox event of a store on either backend, as ``(kind, payload)``, in order,
    read straight from its table."""
    import sqlite3

    from tests import pg

    db = str(location)
    if pg.is_pg(db):
        rows = pg.fetch(f'SELECT kind, payload::text FROM "{pg.schema_of(db)}".outbox '
                        "ORDER BY seq")
    else:
        conn = sqlite3.connect(db)
        try:
            rows = conn.execute("SELECT kind, payload FROM outbox ORDER BY seq").fetchall()
        finally:
            conn.close()
    return [(str(kind), json.loads(payload)) for kind, payload in rows]
