"""A ``--target-adapter`` factory gets its settings (issue 29 point 5): the token, the
timeout and ``--target-option KEY=VALUE`` (or the config file's ``[target]`` table) reach a
factory that has a ``settings`` parameter; a one-argument factory keeps working, and is
refused when any are given; a built-in target refuses what it does not take; nothing is
silently dropped, and ``config show`` never shows a secret."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from runner import TargetSettings
from runner.io.targets.compose import TargetOptions, open_adapter, takes_settings
from tests.helpers import ROOT, CliStore, event, last_json, run_cli, run_main, write_json
from tests.procs import settings_adapter
from tests.procs.settings_adapter import received

pytestmark = pytest.mark.timeout(60)

ADAPTER = "tests.procs.settings_adapter:make"
OLD = "tests.procs.example_adapter:make"
TOKEN = "synthetic-token-7f3a"


@pytest.fixture
def store(workdir: Path, scope_file: Path) -> CliStore:
    """A SQLite store whose target is an adapter's rows file (the settings' plumbing is
    the same on both backends: it is decided before a store is opened)."""
    made = CliStore(workdir, scope_file, workdir / "q.db")
    made.target = workdir / "rows.db"
    return made


@pytest.fixture
def token_file(workdir: Path) -> Path:
    path = workdir / "token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    return path


def _toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- what a factory receives ------------------------------------------------------------


@pytest.mark.parametrize("factory", ["make", "make_keyword", "Rows"])
def test_a_factory_receives_the_token_the_timeout_and_the_options_from_the_command_line(
        store: CliStore, token_file: Path, factory: str) -> None:
    store.accept(1, 2)
    summary = store.cli("once", "--target-adapter", f"tests.procs.settings_adapter:{factory}",
                        "--target-token-file", token_file, "--target-timeout", "2.5",
                        "--target-option", "region=eu", "--target-option", "sheet=Leads=2")
    assert (summary["dispatched"], summary["confirmed"]) == (2, 2)
    got = received(store.target)
    assert got["token"] == TOKEN  # stripped of its newline, as every token file is
    assert (got["timeout"], got["options"]) == (2.5, {"region": "eu", "sheet": "Leads=2"})
    assert TOKEN not in str(got["repr"]) and "Leads" not in str(got["repr"])


def test_without_settings_on_the_command_line_a_factory_gets_none_and_the_env_token(
        store: CliStore) -> None:
    store.accept(1)
    proc = store.once("--target-adapter", ADAPTER, env={"RUNNER_TARGET_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    got = received(store.target)
    # no --target-timeout: None, not runner's HTTP default, so the adapter keeps its own
    assert (got["token"], got["timeout"], got["options"]) == (TOKEN, None, {})


def test_a_factory_receives_its_settings_from_the_config_files_target_table(
        store: CliStore, token_file: Path, workdir: Path) -> None:
    conf = _toml(workdir / "runner.toml", f'''
db = "{store.db}"
scope = "{store.scope}"

[target]
location = "{store.target}"
adapter = "{ADAPTER}"
token-file = "{token_file}"
timeout = 4
options = {{ region = "eu", sheet = "Leads" }}
''')
    store.accept(1)
    proc = run_main("once", "--config", conf)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["confirmed"] == 1
    got = received(store.target)
    assert (got["token"], got["timeout"], got["options"]) == (
        TOKEN, 4.0, {"region": "eu", "sheet": "Leads"})


@pytest.mark.parametrize("spelled", [["--target-option", "sheet=Test"],
                                     ["--target-option=sheet=Test"]])
def test_the_command_line_wins_over_the_file_and_options_join_key_by_key(
        store: CliStore, workdir: Path, spelled: list[str]) -> None:
    conf = _toml(workdir / "runner.toml", '''
target-adapter = "tests.procs.no_such_module:make"
[target]
timeout = 4
[target.options]
region = "eu"
sheet = "Leads"
''')
    store.accept(1)
    proc = store.once("--config", conf, "--target-adapter", ADAPTER, "--target-timeout", "1",
                      *spelled)
    assert proc.returncode == 0, proc.stderr
    got = received(store.target)
    assert (got["timeout"], got["options"]) == (1.0, {"region": "eu", "sheet": "Test"})


def test_a_command_table_gives_the_target_options_for_that_command_only(
        store: CliStore, workdir: Path) -> None:
    conf = _toml(workdir / "runner.toml", f'''
target-adapter = "{ADAPTER}"
[target.options]
region = "eu"
[once.target]
options = {{ region = "us" }}
''')
    store.accept(1)
    assert store.once("--config", conf).returncode == 0
    assert received(store.target)["options"] == {"region": "us"}
    assert store.run("poll-status", "--config", conf).returncode == 0
    assert received(store.target)["options"] == {"region": "eu"}


# -- a factory that takes only the target -----------------------------------------------


@pytest.mark.parametrize("spec", [OLD, "tests.procs.settings_adapter:make_other"])
def test_a_one_argument_factory_keeps_working_without_settings(
        store: CliStore, spec: str) -> None:
    store.accept(1)
    # a token in the environment is ambient (it may be meant for another run): not an error
    proc = store.once("--target-adapter", spec, env={"RUNNER_TARGET_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["confirmed"] == 1


@pytest.mark.parametrize(("extra", "named"), [
    (["--target-token-file", "TOKEN"], "--target-token-file was given"),
    (["--target-timeout", "3"], "--target-timeout was given"),
    (["--target-option", "region=eu", "--target-option", "sheet=Leads"],
     "--target-option region, --target-option sheet were given"),
])
def test_a_one_argument_factory_is_refused_when_settings_are_given_and_nothing_changes(
        store: CliStore, token_file: Path, extra: list[str], named: str) -> None:
    store.accept(1)
    argv = [str(token_file) if a == "TOKEN" else a for a in extra]
    proc = store.once("--target-adapter", OLD, *argv)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and "parameter named settings" in proc.stderr
    assert TOKEN not in proc.stderr + proc.stdout
    assert store.records()["lead-1"]["state"] == "prepared"
    assert not store.target.exists()  # the factory was never called


def test_a_factory_refusing_its_options_is_one_clear_error(store: CliStore) -> None:
    store.accept(1)
    proc = store.once("--target-adapter", ADAPTER, "--target-option", "refuse=yes")
    assert proc.returncode == 2
    assert "failed: ValueError: this adapter takes no option 'refuse'" in proc.stderr
    assert store.records()["lead-1"]["state"] == "prepared"


def test_how_a_factory_says_it_takes_settings() -> None:
    assert takes_settings(settings_adapter.make)
    assert takes_settings(settings_adapter.make_keyword)
    assert takes_settings(settings_adapter.Rows)
    assert not takes_settings(settings_adapter.make_other)
    assert not takes_settings(lambda target, **kw: None)  # only the name says it
    assert not takes_settings(lambda target, *, settings_=None: None)
    assert not takes_settings(len)  # a builtin takes one argument


def test_the_settings_hide_their_secrets_and_cannot_be_changed() -> None:
    settings = TargetSettings(token=TOKEN.encode(), timeout=3.0,
                              options={"region": "eu", "api-key": SECRET})
    assert repr(settings) == ("TargetSettings(token=<set>, timeout=3.0, "
                              "options=['api-key', 'region'])")
    with pytest.raises(TypeError):
        settings.options["region"] = "us"  # type: ignore[index]
    assert hash(settings) == hash(TargetSettings(token=TOKEN.encode(), timeout=3.0, options={
        "api-key": SECRET, "region": "eu"}))
    with pytest.raises(ValueError, match="not an option key"):
        TargetSettings(options={"1x": "eu"})
    with pytest.raises(TypeError, match="must be a string"):
        TargetSettings(options={"retries": 3})  # type: ignore[dict-item]


# -- built-in targets ------------------------------------------------------------------


@pytest.mark.parametrize(("command", "target", "extra", "says"), [
    ("once", "rows.db", ["--target-option", "region=eu"],
     "the synthetic target (a SQLite file) takes no --target-option region "
     "(--target-option is for a --target-adapter factory)"),
    ("once", "rows.db", ["--target-timeout", "3"],
     "takes no --target-timeout (--target-token-file is for an http(s):// --target or a "
     "factory, --target-timeout for those and a postgresql:// --target)"),
    ("poll-status", "http://127.0.0.1:9/t", ["--target-option", "a=b"],
     "the HTTP target takes no --target-option a"),
    ("accept", "rows.db", ["--target-option", "a=b"], "takes no --target-option a"),
    ("status", "rows.db", ["--target-timeout", "3"], "takes no --target-timeout"),
    ("resolve", None, ["--target-option", "a=b"],
     "--target-option a needs --target (or --target-adapter)"),
])
def test_a_built_in_target_refuses_what_it_does_not_take_before_anything_is_opened(
        store: CliStore, workdir: Path, command: str, target: str | None,
        extra: list[str], says: str) -> None:
    store.accept(1)
    argv: list[str | Path] = [command, "--db", store.db]
    if target is not None:
        argv += ["--target", workdir / target if "://" not in target else target]
    rest: dict[str, list[str | Path]] = {
        "accept": ["--scope", store.scope, "--record", write_json(workdir / "e2.json",
                                                                  event(2))],
        "resolve": ["--write-id", "w", "--as", "confirmed", "--reason", "r"],
        "status": []}
    argv += rest.get(command, ["--scope", store.scope])
    proc = run_main(*argv, *extra)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert [r["source_lead_id"] for r in store.all_records()] == ["lead-1"]
    assert not (workdir / "rows.db").exists()


def test_the_http_target_keeps_its_own_timeout_unless_one_is_given() -> None:
    from runner.io.targets.http import HttpTarget

    plain = open_adapter(TargetOptions("http://127.0.0.1:9/t"))
    given = open_adapter(TargetOptions("http://127.0.0.1:9/t",
                                       settings=TargetSettings(timeout=2.5),
                                       given=("--target-timeout",)))
    assert isinstance(plain, HttpTarget) and isinstance(given, HttpTarget)
    try:
        assert (plain.timeouts.read, given.timeouts.read) == (10.0, 2.5)
    finally:
        plain.close()
        given.close()


# -- bad options -----------------------------------------------------------------------


SECRET = "hunter2-value"


@pytest.mark.parametrize(("option", "says"), [
    ("region" + SECRET, "--target-option: takes KEY=VALUE (no '=' was given)"),
    ("=" + SECRET, "'' is not an option key"),
    ("1region=" + SECRET, "'1region' is not an option key"),
    ("re gion=" + SECRET, "'re gion' is not an option key"),
    ("a.b=" + SECRET, "'a.b' is not an option key"),
    ("k" * 65 + "=" + SECRET, "at most 64"),
])
def test_a_bad_option_is_a_usage_error_that_never_shows_a_value(
        store: CliStore, option: str, says: str) -> None:
    store.accept(1)
    proc = store.once("--target-adapter", ADAPTER, "--target-option", option)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert SECRET not in proc.stderr
    assert not store.target.exists()


def test_a_repeated_option_key_is_a_usage_error(store: CliStore) -> None:
    proc = store.once("--target-adapter", ADAPTER, "--target-option", "region=eu",
                      "--target-option", "region=us")
    assert proc.returncode == 2
    assert "--target-option region: given twice" in proc.stderr
    assert not store.target.exists()


@pytest.mark.parametrize(("text", "says"), [
    ('[target]\noptions = { region = 3 }\n',
     "bad.toml: target.options.region: an option's value is a string; write it in quotes"),
    ('[target]\noptions = { "1x" = "eu" }\n', "'1x' is not an option key"),
    ('target-option = ["region=eu", "region=us"]\n', "--target-option region: given twice"),
    ('target-timeout = 3\n[target]\ntimeout = 4\n',
     "target-timeout and target.timeout name one flag (--target-timeout); keep one"),
    ('[target]\nadapterr = "m:f"\n', "unknown key: target.adapterr"),
    ('poll-limit = 3\npoll_limit = 4\n',
     "poll-limit and poll_limit name one flag (--poll-limit); keep one"),
    ('[target]\nrate = "fast"\n', "bad.toml: target.rate: rate 'fast': give requests per time"),
])
def test_a_bad_target_table_is_refused_by_key_and_nothing_runs(
        store: CliStore, workdir: Path, text: str, says: str) -> None:
    conf = _toml(workdir / "bad.toml", text)
    store.accept(1)
    proc = store.once("--config", conf, "--target-adapter", ADAPTER)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert not store.target.exists()
    assert store.records()["lead-1"]["state"] == "prepared"


# -- config show -----------------------------------------------------------------------


def test_config_show_masks_option_values_and_never_prints_the_token(
        store: CliStore, token_file: Path, workdir: Path) -> None:
    conf = _toml(workdir / "runner.toml", f'''
[target]
adapter = "{ADAPTER}"
token-file = "{token_file}"
options = {{ api-secret = "s3cr3t-value", region = "eu" }}
''')
    proc = run_main("config", "show", "--config", conf, "once", "--db", store.db,
                    "--scope", store.scope, "--target", store.target,
                    "--target-option", "sheet=Leads",
                    env={"RUNNER_TARGET_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    values: dict[str, Any] = json.loads(proc.stdout)["values"]
    assert values["target-option"] == {
        "value": {"api-secret": "***", "region": "***", "sheet": "***"},
        "from": "flag and file"}
    assert values["target-adapter"] == {"value": ADAPTER, "from": "file"}
    assert values["target-token-file"] == {"value": str(token_file), "from": "file"}
    assert values["target-timeout"] == {"value": None, "from": "default"}
    for secret in ("s3cr3t", "Leads", TOKEN):
        assert secret not in proc.stdout + proc.stderr


# -- every command that opens a target; one real process -------------------------------


def test_every_command_that_opens_a_target_gives_its_factory_the_settings(
        store: CliStore, workdir: Path) -> None:
    settings = ["--target-adapter", ADAPTER, "--target-option", "region=eu"]
    store.accept(1)
    proc = store.once(*settings, "--fault", "timeout")  # written, then uncertain
    assert last_json(proc.stdout)["uncertain"] == 1
    write_id = store.records()["lead-1"]["write_id"]
    runs: dict[str, list[str | Path]] = {
        "resolve": ["resolve", "--db", store.db, "--target", store.target, "--write-id",
                    write_id, "--as", "confirmed", "--reason", "read back by hand"],
        "poll-status": ["poll-status", "--db", store.db, "--scope", store.scope,
                        "--target", store.target],
        "observe": ["observe", "--db", store.db, "--scope", store.scope, "--target",
                    store.target, "--record", workdir / "e1.json", "--snapshot",
                    write_json(workdir / "snap.json", {"status": "won"})],
    }
    for command, argv in runs.items():
        region = f"{command}-region"
        proc = run_main(*argv, "--target-adapter", ADAPTER, "--target-option",
                        f"region={region}")
        assert proc.returncode == 0, (command, proc.stderr)
        assert received(store.target)["options"] == {"region": region}, command
        refused = run_main(*argv, "--target-adapter", OLD, "--target-option", "region=x")
        assert refused.returncode == 2 and "parameter named settings" in refused.stderr
    assert store.records()["lead-1"]["state"] == "confirmed"


def test_start_in_a_real_process_gives_its_factory_the_files_settings_and_refuses_an_old_one(
        store: CliStore, token_file: Path, workdir: Path) -> None:
    conf = _toml(workdir / "runner.toml", f'''
db = "{store.db}"
scope = "{store.scope}"
[target]
location = "{store.target}"
adapter = "{ADAPTER}"
token-file = "{token_file}"
options = {{ region = "eu" }}
''')
    store.accept(1, 2)
    done = run_cli("start", "--config", conf, "--cycles", "1", "--interval", "0",
                   "--target-timeout", "7", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["confirmed"] == 2
    got = received(store.target)
    assert (got["token"], got["timeout"], got["options"]) == (TOKEN, 7.0, {"region": "eu"})
    assert TOKEN not in done.stderr
    old = run_cli("start", "--config", conf, "--cycles", "1", "--target-adapter", OLD,
                  cwd=workdir)
    assert old.returncode == 2
    assert ("takes no settings, but --target-token-file, --target-option region were "
            "given") in old.stderr


# -- the pages -------------------------------------------------------------------------


def _blocks(page: str, language: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("page", ["reference/configuration.md", "how-to/target-adapter.md"])
def test_the_pages_config_examples_pass_config_show(workdir: Path, scope_file: Path,
                                                    page: str) -> None:
    examples = _blocks(page, "toml")
    assert examples, page
    for i, text in enumerate(examples):
        conf = _toml(workdir / f"example{i}.toml", text)
        proc = run_main("config", "show", "--config", conf, "start", "--db", workdir / "q.db",
                        "--scope", scope_file)
        assert proc.returncode == 0, (text, proc.stderr)
        values = json.loads(proc.stdout)["values"]
        if "[target]" in text:
            assert values["target-adapter"]["from"] == "file"
            assert set(values["target-option"]["value"]) == {"region", "sheet"}


def test_the_how_tos_settings_factory_runs_as_shown() -> None:
    (source,) = [b for b in _blocks("how-to/target-adapter.md", "python")
                 if "settings: TargetSettings" in b]
    space: dict[str, Any] = {"CrmAdapter": lambda **kw: kw}
    exec(compile(source, "target-adapter.md", "exec"), space)
    made = space["make"]("https://crm.example/api", settings=TargetSettings(
        token=b"t", options={"region": "us"}))
    assert made == {"base_url": "https://crm.example/api", "token": "t", "timeout": 30.0,
                    "region": "us", "sheet": "Leads"}
    with pytest.raises(ValueError, match="unknown option regoin"):
        space["make"]("https://crm.example/api", settings=TargetSettings(
            token=b"t", options={"regoin": "us"}))
