"""``--config runner.toml``: the same keys as the flags, flags win, unknown keys refused
by name; ``config show`` says where each value came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import event, run_main, write_json


def _toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _show(*argv: str | Path) -> dict[str, dict[str, object]]:
    done = run_main("config", "show", *argv)
    assert done.returncode == 0, done.stderr
    values: dict[str, dict[str, object]] = json.loads(done.stdout)["values"]
    return values


def test_a_file_gives_the_flags_and_a_flag_on_the_command_line_wins(
        workdir: Path, scope_file: Path) -> None:
    conf = _toml(workdir / "runner.toml",
                 f'db = "{workdir / "q.db"}"\nscope = "{scope_file}"\n'
                 f'target = "{workdir / "t.db"}"\ninterval = 2\npoll_limit = 7\n')
    values = _show("--config", conf, "start", "--interval", "0.5")
    assert values["interval"] == {"value": 0.5, "from": "flag"}
    assert values["poll-limit"] == {"value": 7, "from": "file"}
    assert values["db"] == {"value": str(workdir / "q.db"), "from": "file"}
    assert values["grace"] == {"value": 30.0, "from": "default"}


def test_a_command_table_wins_over_the_top_level_for_that_command_only(
        workdir: Path, scope_file: Path) -> None:
    conf = _toml(workdir / "runner.toml",
                 f'db = "{workdir / "q.db"}"\nlog_level = "warning"\n'
                 '[status]\nlog-level = "debug"\n')
    assert _show("--config", conf, "status")["log-level"] == {"value": "debug", "from": "file"}
    # a key another command has (interval) is not an error for status; its own is used
    assert _show("--config", conf, "uncertain")["log-level"]["value"] == "warning"


def test_a_run_takes_its_options_from_the_file(workdir: Path, scope_file: Path) -> None:
    conf = _toml(workdir / "runner.toml",
                 f'db = "{workdir / "q.db"}"\nscope = "{scope_file}"\n'
                 f'target = "{workdir / "t.db"}"\n')
    record = write_json(workdir / "e1.json", event(1))
    assert run_main("accept", "--config", conf, "--record", record).returncode == 0
    done = run_main("once", f"--config={conf}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["confirmed"] == 1


@pytest.mark.parametrize(("text", "says"), [
    ('db = "q.db"\nintervall = 3\n[strat]\nx = 1\n[start]\ncyclez = 1\n',
     "unknown keys: intervall, [strat], [start] cyclez"),
    ('db = "q.db"\ninterval = "abc"\n', "interval: 'abc' is not a number"),
    ('db = "q.db"\ninterval = -1\n', "interval: '-1' must be between 0 and 86400"),
    ('db = "q.db"\nlog_format = "xml"\n', "log_format: 'xml' is not one of text, json"),
    ('db = ["a.db", "b.db"]\n', "db: takes one value, not a list"),
    ('db = "q.db"\ninterval = [\n', "is not valid TOML"),
])
def test_a_bad_file_is_refused_by_key_and_nothing_is_created(
        workdir: Path, scope_file: Path, text: str, says: str) -> None:
    conf = _toml(workdir / "bad.toml", text)
    done = run_main("start", "--config", conf, "--scope", scope_file, "--target",
                    workdir / "t.db", "--cycles", "1", cwd=workdir, guard=False)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert not (workdir / "q.db").exists() and not (workdir / "t.db").exists()


def test_a_missing_file_is_a_usage_error(workdir: Path) -> None:
    done = run_main("status", "--config", workdir / "nope.toml")
    assert done.returncode == 2
    assert "cannot read the configuration file" in done.stderr


def test_config_given_twice_is_a_usage_error(workdir: Path) -> None:
    conf = _toml(workdir / "runner.toml", 'db = "q.db"\n')
    done = run_main("status", "--config", conf, "--config", conf)
    assert done.returncode == 2
    assert "--config is given twice" in done.stderr
