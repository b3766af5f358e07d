"""A real PostgreSQL primary and its streaming standby, on private loopback ports.

For the tests (``tests/pgcluster.py``: ``private_pair``) and for users who want to see
runner ride a failover on their own machine::

    python -m harness.pgpair up --dir /tmp/pair [--sync] [--database NAME]
    python -m harness.pgpair status --dir /tmp/pair
    python -m harness.pgpair lag --dir /tmp/pair        # an asynchronous standby falls behind
    python -m harness.pgpair catch-up --dir /tmp/pair
    python -m harness.pgpair failover --dir /tmp/pair   # kill -9 the primary, promote
    python -m harness.pgpair down --dir /tmp/pair

Each command prints one JSON line; ``up``, ``status`` and ``failover`` carry ``dsn``, the
multi-host DSN to give runner, ``postgresql://…@127.0.0.1:P1,127.0.0.1:P2/DB?
target_session_attrs=read-write`` (whichever of the two accepts writes); ``up`` and
``status`` also ``made`` (how the pair was made: synchronous or asynchronous), ``nodes``
(each node's port and role) and ``replication`` (the primary's ``pg_stat_replication``).
An error is one line on stderr and exit 1.

How the pair is made.  Node ``a`` is made with ``initdb`` (``harness.pgcluster``: trust
authentication on loopback, the server tools run as ``postgres`` under root); node ``b``
is a copy of it taken with ``pg_basebackup -R -X stream``, which also writes the standby's
``primary_conninfo``, and streams from ``a`` from then on.  Each node's ``cluster_name`` is
its name, so the standby is ``b`` in the primary's ``pg_stat_replication``.  With
``--sync`` the primary then sets ``synchronous_standby_names = 'b'`` and
``synchronous_commit = on`` (a commit returns once ``b`` has flushed it), and ``up``
returns once ``b`` is the synchronous standby; without it, replication is asynchronous.
Only the first primary names a synchronous standby: after a failover the promoted node
runs alone (no standby: a commit does not wait), as a real setup does until a new standby
is attached.

A lagging standby (``lag``).  Pausing WAL replay (``pg_wal_replay_pause()``) or delaying
it (``recovery_min_apply_delay``) does not make a standby that *lacks* commits: the WAL
still arrives and is flushed on the standby, and promotion replays all of it before the
server takes writes, so every acknowledged commit survives (``tests/test_pgpair.py``
shows both).  What loses acknowledged commits at a failover is WAL that never reached
the standby, a network partition between the two.  ``lag`` makes exactly that: the
standby's ``primary_conninfo`` is emptied and reloaded, so its WAL receiver stops and the
primary goes on alone; ``lag`` returns once the primary sees no standby.  Every commit
from then on exists on the primary only, until ``catch-up`` reconnects the standby (and
waits until it has replayed everything).  ``lag`` refuses a synchronous pair (its
commits would wait for the standby forever).

The shared server on port 5432 is never touched: ``up`` takes two free ports (or
``--ports``, refused when in use), and every command acts on the nodes recorded in
``DIR/pgpair.json`` only.  ``down`` stops both nodes (immediately, else with kill -9) and
removes ``DIR/a``, ``DIR/b`` and the record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.pgcluster import (
    Cluster,
    attach,
    bindir,
    directory,
    free_port,
    keep,
    make_cluster,
    server_user,
    unavailable,
    wait_until,
)

NAMES = ("a", "b")
STATE_FILE = "pgpair.json"
#: seconds a node may take to stream, to catch up, to be promoted
TIMEOUT = 60.0
#: seconds a node may take to say whether it is a primary (else it counts as down)
ROLE_TIMEOUT = 3.0


class PairError(Exception):
    """A pair command that cannot be done (one line for the user)."""


@dataclass
class Pair:
    """Two nodes, ``a`` and ``b``; which one is the primary is asked of the servers."""

    root: Path
    nodes: dict[str, Cluster]
    synchronous: bool
    database: str = "postgres"

    # -- what the nodes are ---------------------------------------------------------------

    def role(self, name: str) -> str:
        """``primary``, ``standby`` or ``down``."""
        node = self.nodes[name]
        if not node.is_running():
            return "down"
        try:  # a stopped or hung node answers nothing: down, after a short wait
            rows = node.fetch("SELECT pg_is_in_recovery()", timeout=ROLE_TIMEOUT)
        except Exception:  # noqa: BLE001 - a node that does not answer is down for us
            return "down"
        return "standby" if rows[0][0] else "primary"

    def primary(self) -> Cluster:
        return self._one("primary")

    def standby(self) -> Cluster:
        return self._one("standby")

    def name_of(self, node: Cluster) -> str:
        return next(name for name, each in self.nodes.items() if each is node)

    def _one(self, role: str) -> Cluster:
        found = [node for name, node in self.nodes.items() if self.role(name) == role]
        if not found:
            raise PairError(f"no node of the pair is a running {role}")
        return found[0]

    @property
    def superuser(self) -> str:
        return self.nodes["a"].superuser

    def dsn(self, database: str | None = None, *, user: str | None = None,
            **params: str) -> str:
        """The multi-host DSN: both nodes, the writable one chosen at connect."""
        hosts = ",".join(node.address for node in self.nodes.values())
        query = "&".join(f"{k}={v}" for k, v in
                         {"target_session_attrs": "read-write", **params}.items())
        return (f"postgresql://{user or self.superuser}@{hosts}/"
                f"{database or self.database}?{query}")

    def replication(self) -> list[dict[str, Any]]:
        """The primary's ``pg_stat_replication``: one row per standby it streams to."""
        rows = self.primary().fetch(
            "SELECT application_name, state, sync_state, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint "
            "FROM pg_stat_replication ORDER BY application_name")
        return [{"standby": name, "state": state, "sync_state": sync, "replay_lag_bytes": lag}
                for name, state, sync, lag in rows]

    def status(self) -> dict[str, Any]:
        nodes = {name: {"port": node.port, "role": self.role(name)}
                 for name, node in self.nodes.items()}
        primaries = [n for n, facts in nodes.items() if facts["role"] == "primary"]
        return {"dsn": self.dsn(),
                "made": "synchronous" if self.synchronous else "asynchronous",
                "nodes": nodes, "replication": self.replication() if primaries else None}

    # -- replication ----------------------------------------------------------------------

    def _streaming(self, name: str, *, sync: bool) -> bool:
        try:
            rows = self.primary().fetch(
                "SELECT state, sync_state FROM pg_stat_replication "
                "WHERE application_name = $1", name)
        except PairError:
            return False
        return any(state == "streaming" and (not sync or sync_state == "sync")
                   for state, sync_state in rows)

    def wait_streaming(self, timeout: float = TIMEOUT) -> None:
        """Until the primary streams to the standby (as its synchronous standby, for a
        synchronous pair)."""
        name = self.name_of(self.standby())
        wait_until(lambda: self._streaming(name, sync=self.synchronous), timeout,
                   f"standby {name} to stream")

    def wait_replayed(self, timeout: float = TIMEOUT) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        lsn = self.primary().fetch("SELECT pg_current_wal_lsn()::text")[0][0]
        standby = self.standby()
        wait_until(lambda: standby.fetch(
            "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
            lsn)[0][0], timeout, "the standby to replay the primary's WAL")

    def lag(self, timeout: float = TIMEOUT) -> None:
        """Cut the stream: the standby stops receiving WAL, the primary goes on alone."""
        if self.synchronous:
            raise PairError("lag is for an asynchronous pair: a synchronous primary's "
                            "commits would wait for the standby forever")
        standby, primary = self.standby(), self.primary()
        name = self.name_of(standby)
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        standby.execute("SELECT pg_reload_conf()")
        wait_until(lambda: not standby.fetch("SELECT 1 FROM pg_stat_wal_receiver")
                   and not primary.fetch("SELECT 1 FROM pg_stat_replication "
                                         "WHERE application_name = $1", name),
                   timeout, "the standby's WAL receiver to stop")

    def catch_up(self, timeout: float = TIMEOUT) -> None:
        """Reconnect the standby to the primary and wait until it has replayed all."""
        standby, primary = self.standby(), self.primary()
        conninfo = f"host=127.0.0.1 port={primary.port} user={self.superuser}"
        standby.execute(f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'")
        standby.execute("SELECT pg_reload_conf()")
        self.wait_streaming(timeout)
        self.wait_replayed(timeout)

    # -- failover -------------------------------------------------------------------------

    def kill_primary(self) -> Cluster:
        """SIGKILL the primary's postmaster; returns once it and its backends are gone."""
        primary = self.primary()
        primary.kill9()
        return primary

    def promote(self, timeout: float = TIMEOUT, standby: Cluster | None = None) -> float:
        """``pg_ctl promote`` the standby and wait until it commits a write (a
        transaction id: refused during recovery); the seconds that took."""
        standby = standby or self.standby()
        began = time.monotonic()
        standby.tool("pg_ctl", "-D", standby.data, "-w", "-t", str(int(timeout)), "promote",
                     timeout=timeout + 10)

        def writable() -> bool:
            try:
                standby.fetch("SELECT txid_current()")
            except Exception:  # noqa: BLE001 - still read-only, or still starting
                return False
            return True

        wait_until(writable, timeout, "the promoted standby to take writes")
        return time.monotonic() - began

    def failover(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        """kill -9 the primary, promote the standby."""
        standby = self.standby()
        killed = self.kill_primary()
        seconds = self.promote(timeout)
        return {"killed": self.name_of(killed), "promoted": self.name_of(standby),
                "promotion_seconds": round(seconds, 3), "dsn": self.dsn()}

    # -- teardown -------------------------------------------------------------------------

    def destroy(self) -> None:
        """Stop both nodes however they are and remove their files and the record."""
        for node in self.nodes.values():
            node.destroy()
        (self.root / STATE_FILE).unlink(missing_ok=True)

    # -- the record of a pair (for the command line) ----------------------------------------

    def save(self) -> None:
        record = {"version": 1, "synchronous": self.synchronous, "database": self.database,
                  "bindir": str(self.nodes["a"].bindir), "user": self.nodes["a"].user,
                  "nodes": {name: node.port for name, node in self.nodes.items()}}
        (self.root / STATE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def make_pair(*, synchronous: bool, root: Path | None = None,
              ports: Sequence[int] | None = None, database: str = "postgres") -> Pair:
    """A running primary (``a``) and its streaming standby (``b``), in ``root`` (made;
    default: two temporary directories), on ``ports`` (default: two free ones).  Torn
    down at once if any step fails (and, in a test process, at exit)."""
    made: list[Cluster] = []
    try:
        a = make_cluster({"cluster_name": "'a'", "synchronous_commit": "on"},
                         root=root / "a" if root else None,
                         port=ports[0] if ports else None)
        made.append(a)
        b = attach(directory(a.user, root / "b" if root else None),
                   ports[1] if ports else free_port())
        made.append(b)
        a.tool("pg_basebackup", "-D", b.data, "-R", "-X", "stream", "-c", "fast",
               "--no-sync", "-h", "127.0.0.1", "-p", str(a.port), "-U", a.superuser,
               timeout=TIMEOUT)
        # the copy has a's settings: b's own name and socket directory win (later lines)
        b.configure({"cluster_name": "'b'", "unix_socket_directories": f"'{b.root}'"})
        b.start()
        pair = Pair(root or a.root, {"a": a, "b": b}, synchronous, database)
        if synchronous:
            a.execute("ALTER SYSTEM SET synchronous_standby_names = 'b'")
            a.execute("SELECT pg_reload_conf()")
        pair.wait_streaming()
        if database != "postgres":
            a.execute(f'CREATE DATABASE "{database}"')
            pair.wait_replayed()
        return pair
    except BaseException:
        for node in made:
            node.destroy()
        raise


@contextlib.contextmanager
def private_pair(*, synchronous: bool) -> Iterator[Pair]:
    """A pair for the ``with`` block, then gone."""
    pair = make_pair(synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.destroy()


def load(root: Path) -> Pair:
    """The pair recorded in ``root`` by ``up``."""
    try:
        record = json.loads((root / STATE_FILE).read_text())
    except FileNotFoundError:
        raise PairError(f"no pair in {root} (no {STATE_FILE}: run up first)") from None
    except (OSError, ValueError) as exc:
        raise PairError(f"cannot read {root / STATE_FILE}: {exc}") from None
    nodes = {}
    for name, port in record["nodes"].items():
        node = Cluster(root / name, int(port), Path(record["bindir"]), record["user"])
        nodes[name] = node
    return Pair(root, nodes, bool(record["synchronous"]), str(record["database"]))


# -- the command line ---------------------------------------------------------------------

def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(text: str) -> list[int]:
    try:
        ports = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("--ports takes two port numbers, P1,P2") from None
    if len(ports) != 2 or len(set(ports)) != 2 or not all(1024 <= p <= 65535 for p in ports):
        raise argparse.ArgumentTypeError("--ports takes two different ports from 1024 to "
                                         "65535, P1,P2")
    return ports


def _reachable(root: Path, user: str | None) -> None:
    """The server's user must be able to write in ``root`` (root's own /root is not)."""
    if user is None:
        return
    check = subprocess.run(["runuser", "-u", user, "--", "test", "-w", str(root)],
                           capture_output=True, check=False)
    if check.returncode != 0:
        raise PairError(f"the server runs as {user!r}, who cannot write in {root}: choose a "
                        "directory that user can reach (under /tmp, for example)")


def _up(args: argparse.Namespace) -> dict[str, Any]:
    root: Path = args.dir.absolute()
    if (root / STATE_FILE).exists():
        raise PairError(f"a pair is already recorded in {root}: run down first")
    for name in NAMES:
        if (root / name).exists():
            raise PairError(f"{root / name} exists already: choose an empty directory")
    if args.ports and not all(_port_free(p) for p in args.ports):
        raise PairError(f"a port of {args.ports} is in use: choose others")
    if not args.database.replace("_", "").isalnum():
        raise PairError("--database takes a plain name (letters, digits, underscores)")
    made_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    user = server_user()
    if user is not None and made_root:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    _reachable(root, user)
    pair = make_pair(synchronous=args.sync, root=root, ports=args.ports,
                     database=args.database)
    for node in pair.nodes.values():
        keep(node)
    pair.save()
    return {"result": "up", **pair.status()}


def _down(args: argparse.Namespace) -> dict[str, Any]:
    pair = load(args.dir.absolute())
    for node in pair.nodes.values():
        node.destroy()
    (pair.root / STATE_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        pair.root.rmdir()  # only when empty: anything of the user's stays
    return {"result": "down", "dir": str(pair.root)}


def _act(args: argparse.Namespace) -> dict[str, Any]:
    pair = load(args.dir.absolute())
    if args.command == "failover":
        return {"result": "failover", **pair.failover()}
    if args.command == "lag":
        pair.lag()
        return {"result": "lagging", **pair.status()}
    if args.command == "catch-up":
        pair.catch_up()
        return {"result": "caught_up", **pair.status()}
    return {"result": "status", **pair.status()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.pgpair",
                                     description="A PostgreSQL primary and its streaming "
                                                 "standby on private loopback ports.")
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {"up": "make and start the pair; print the multi-host DSN",
             "status": "each node's role and the primary's replication",
             "lag": "cut the stream: the asynchronous standby falls behind",
             "catch-up": "reconnect the standby and wait until it has replayed all",
             "failover": "kill -9 the primary's postmaster and promote the standby",
             "down": "stop both nodes and remove their files"}
    for name, text in helps.items():
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument("--dir", type=Path, required=True,
                             help="the pair's directory (DIR/a, DIR/b, DIR/pgpair.json)")
        if name == "up":
            command.add_argument("--sync", action="store_true",
                                 help="synchronous replication (default: asynchronous)")
            command.add_argument("--ports", type=_ports, metavar="P1,P2",
                                 help="the two nodes' ports (default: two free ones)")
            command.add_argument("--database", default="postgres",
                                 help="a database to create for runner (default: postgres)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reason = unavailable()
    try:
        if reason is not None or bindir() is None:
            raise PairError(reason or "no PostgreSQL server tools")
        if shutil.which("pg_basebackup", path=str(bindir())) is None:
            raise PairError(f"no pg_basebackup in {bindir()}")
        if args.command == "up":
            doc = _up(args)
        elif args.command == "down":
            doc = _down(args)
        else:
            doc = _act(args)
    except (PairError, RuntimeError, TimeoutError) as exc:
        print(f"pgpair: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
