"""A PostgreSQL DSN with several hosts (issue 30 point 3): parsed host by host, described
without its user or password wherever runner prints it, and refused in one usage line
when a port or a parameter is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.pgcluster import free_port
from runner.errors import UsageError
from runner.io.postgres import dsn as pg_dsn
from tests.helpers import event, run_main, write_json

pytestmark = pytest.mark.timeout(60)

PAIR = "postgresql://app:s3cret@db1.example:5432,db2.example:6543/leads"


def test_a_multi_host_dsn_is_tried_host_by_host_with_its_parameters() -> None:
    loc = pg_dsn.parse(f"{PAIR}?target_session_attrs=read-write&schema=eu&sslmode=disable")
    assert (loc.schema, loc.where, loc.session_attrs) == (
        "eu", "db1.example:5432,db2.example:6543/leads", "read-write")
    assert loc.several_hosts
    # one DSN per host, the user, password and every parameter but runner's own kept
    assert loc.hosts == (
        ("db1.example:5432", "postgresql://app:s3cret@db1.example:5432/leads"
                             "?target_session_attrs=read-write&sslmode=disable"),
        ("db2.example:6543", "postgresql://app:s3cret@db2.example:6543/leads"
                             "?target_session_attrs=read-write&sslmode=disable"))
    assert loc.params == {"target_session_attrs", "sslmode"}


def test_hosts_take_5432_by_default_and_ipv6_in_brackets() -> None:
    loc = pg_dsn.parse("postgresql://u@h1,[::1]:5433,[fe80::1]/db")
    assert loc.where == "h1:5432,[::1]:5433,[fe80::1]:5432/db"
    assert [label for label, _ in loc.hosts] == ["h1:5432", "[::1]:5433", "[fe80::1]:5432"]
    single = pg_dsn.parse("postgresql://u@h1/db")
    assert not single.several_hosts and single.hosts == (("h1:5432", single.dsn),)


@pytest.mark.parametrize(("dsn", "says"), [
    ("postgresql://u@h1:5432,h2:x/db", "port 'x' is not a number from 1 to 65535"),
    ("postgresql://u@h1:0/db", "port '0'"),
    ("postgresql://u@h1:70000,h2/db", "port '70000'"),
    ("postgresql://u@h1,h2/db?target_session_attrs=writable",
     "target_session_attrs='writable' is not one of any, primary, standby"),
    ("postgresql://u@h1/db?target_session_attrs=any&target_session_attrs=read-write",
     "target_session_attrs more than once"),
    ("postgresql://u@h1/db?connect_timeout=soon", "connect_timeout='soon' is not a whole"),
])
def test_a_bad_host_list_or_parameter_is_one_usage_line(dsn: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        pg_dsn.parse(dsn)


def test_connect_timeout_is_each_hosts_and_never_sent_to_the_server() -> None:
    loc = pg_dsn.parse("postgresql://u@h1,h2/db?connect_timeout=3&application_name=x")
    assert loc.connect_timeout == 3.0
    assert all("connect_timeout" not in dsn for _, dsn in loc.hosts)
    assert pg_dsn.parse("postgresql://u@h/db?connect_timeout=1").connect_timeout == 2.0
    assert pg_dsn.parse("postgresql://u@h/db?connect_timeout=0").connect_timeout is None


def test_no_message_shows_the_user_or_the_password(workdir: Path, scope_file: Path) -> None:
    ports = free_port(), free_port()  # nothing listens there
    db = (f"postgresql://app:s3cret@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/leads"
          "?target_session_attrs=read-write")
    record = write_json(workdir / "e.json", event(1))
    where = f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/leads"
    for argv in (["accept", "--scope", scope_file, "--record", record], ["status"],
                 ["uncertain"]):
        proc = run_main(argv[0], "--db", db, *argv[1:])
        assert proc.returncode == 74, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        line = proc.stderr.strip()
        assert where in line and "connection refused" in line, line
        assert "s3cret" not in line and "app" not in line, line
    shown = run_main("config", "show", "start", "--db", db, "--scope", scope_file,
                     "--target", workdir / "t.db")
    assert shown.returncode == 0, shown.stderr
    value = json.loads(shown.stdout)["values"]["db"]["value"]
    assert "s3cret" not in value and f"127.0.0.1:{ports[1]}" in value
