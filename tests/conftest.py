from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from runner.io.stores import open_store
from runner.leads.models import Scope
from runner.store import Store
from tests import pg
from tests.helpers import SCOPE, CliStore, write_json

BACKENDS = ["sqlite", "postgres"]

#: at most this many test processes for ``-n auto`` (pytest-xdist), whatever the cores:
#: a PostgreSQL test may hold ten sessions (worker, lock, children, raw checks) and the
#: server's default ``max_connections`` is 100, shared with whoever else uses it
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process per core and one more, at most ``MAX_WORKERS``: many
    tests spend their time waiting on a child process or on the server, and a third
    process on two cores ran a mixed sample of the suite 1.56 times as fast as two."""
    return max(1, min(len(os.sched_getaffinity(0)) + 1, MAX_WORKERS))


#: the long variants of tests whose other variants stay in the default run: they run with
#: the slow campaigns (``pytest -m slow``, which .ci/run runs after the default run), so
#: that the README's test command stays within its time (each is named with its reason)
LONG_VARIANTS = (
    # the countdown on PostgreSQL: a fresh store per failure point (every third: 22 s)
    "tests/test_io_countdown.py::test_countdown_until_a_whole_run_completes[postgres-",
    # 100 refused second workers, each a new server session (20 s)
    "tests/test_lock_trials.py::test_100_second_workers_refused_then_the_next_one_recovers"
    "[postgres]",
    # a kill -9 campaign over HTTP (16 s); the SQLite and PostgreSQL kill -9 samples stay
    "tests/test_kill9.py::test_kill9_over_http_with_server_faults_loses_and_duplicates_nothing",
    # hypothesis on PostgreSQL (12 s); the SQLite run stays
    "tests/test_delivery_property.py::test_never_two_rows_and_only_legal_states[postgres]",
    # two processes racing to create one PostgreSQL store, many rounds (11 s)
    "tests/test_concurrency.py::test_two_processes_creating_a_new_store_end_with_one_store"
    "[postgres]",
    # the quick runs of three benchmarks (24 s); .ci/run also runs `python -m bench --quick`
    "tests/test_bench.py::test_the_http_target_benchmark_runs_both_senders_against_one_server",
    "tests/test_bench.py::test_the_postgresql_table_target_benchmark_runs_runner_and_the_floor",
    "tests/test_bench.py::test_the_resolve_benchmark_settles_every_record_both_ways",
    # the kit at runner's sizes against the version-1 reference server (9 s); the run
    # against the deduplicating server stays
    "tests/test_conformance.py::test_the_http_adapter_conforms_against_the_reference_server",
    # resolve --all's processes on PostgreSQL (13 s): its settle, mixed-set and failed-chunk
    # tests stay on both backends
    "tests/test_resolve_all.py::test_resolve_all_is_refused_while_a_worker_holds_the_lock"
    "[postgres]",
    "tests/test_resolve_all.py::test_a_crash_keeps_every_committed_chunk_and_nothing_of_the_next"
    "[postgres-",
    "tests/test_resolve_all.py::test_sigterm_between_chunks_keeps_what_was_decided_and_leaves_"
    "the_rest[postgres]",
    "tests/test_resolve_all.py::test_a_dry_run_reads_everything_back_and_changes_nothing"
    "[postgres]",
    # half the fuzz cases through main() in process (7 s); the other half stays
    "tests/test_fuzz.py::test_through_the_cli_main_in_process[2]",
    "tests/test_fuzz.py::test_through_the_cli_main_in_process[3]",
    # the single resolve refused beside a PostgreSQL worker (4 s); SQLite's stays, and the
    # lock's PostgreSQL refusals are tested by tests/test_lock_trials.py
    "tests/test_operators.py::test_resolve_is_refused_while_a_worker_holds_the_lock[postgres]",
    # the dedupe proof through the fault wrapper (4 s); the proof itself stays
    "tests/test_kit_dedupe.py::test_the_proof_holds_through_the_fault_wrapper",
    # an emptied or deleted store over HTTP and a PostgreSQL table, and deleted on the
    # synthetic target (20 s); emptied on the synthetic target stays, and the restored
    # store runs against all three targets
    "tests/test_rewind.py::test_an_emptied_or_deleted_store_is_refused_until_adopted_then_"
    "sends_nothing_twice[http-",
    "tests/test_rewind.py::test_an_emptied_or_deleted_store_is_refused_until_adopted_then_"
    "sends_nothing_twice[pgtable-",
    "tests/test_rewind.py::test_an_emptied_or_deleted_store_is_refused_until_adopted_then_"
    "sends_nothing_twice[synthetic-deleted]",
    "tests/test_rewind.py::test_a_newer_timeline_rewinds_a_store_whose_target_keeps_no_marks"
    "[synchronous]",
    # the README test command's budget (about 60 s of test time in all): each of these
    # runs in the slow tier, which .ci/run runs
    "tests/test_kill9.py::test_a_sample_of_kill9_runs_loses_and_duplicates_nothing[postgres]",
    "tests/test_chaos.py::test_a_crash_at_each_point_and_a_random_sample_keep_every_invariant"
    "[postgres-",
    "tests/test_conformance.py::test_the_http_adapter_conforms_against_a_deduplicating_server",
    "tests/test_bulk_accept.py::test_bulk_answers_equal_single_answers[postgres]",
    "tests/test_pipeline_leases.py::test_a_blocking_processor_slower_than_its_lease_drains_",
    "tests/test_start_drain.py::test_a_stage_whose_upstream_is_not_in_the_run_drains_its_own_",
    "tests/test_spin_model.py::test_safety_properties_verify_with_a_store_that_forgets_at_",
    "tests/test_concurrency.py::test_four_processes_accept_1000_distinct_events[postgres]",
    "tests/test_http_processes.py::test_serve_runs_intake_without_the_lock_beside_a_worker"
    "[postgres]",
    "tests/test_ride_through.py::test_a_worker_whose_lock_was_taken_while_it_reconnected_",
    "tests/test_concurrency.py::test_two_processes_creating_a_new_store_end_with_one_store",
    "tests/test_http_target_v2.py::test_an_answer_lost_after_applying_on_a_dedupe_server_",
    "tests/test_alerts.py::test_poll_passes_that_keep_failing_alert_after_the_threshold",
    "tests/test_http_health.py::test_a_stuck_loop_is_stale_and_a_stopping_one_is_not_ready",
    # a PostgreSQL store made again adopts its target (10 s: two schemas made)
    "tests/test_rewind.py::test_a_postgresql_store_made_again_adopts_its_target_and_takes_",
    # marks over HTTP, the kit runs and the call shapes (15 s): a refused append and a
    # server without marks stay
    "tests/test_http_target_marks.py::test_the_kit_proves_a_marks_server",
    "tests/test_http_target_marks.py::test_the_mark_and_read_keys_calls_have_the_documented_",
    "tests/test_http_target_marks.py::test_two_marks_servers_on_one_sheet_serialise_marked_",
    "tests/test_http_target_marks.py::test_a_marks_server_declares_it_and_the_adapter_learns_it",
)

#: the default run's chaos episodes at single crash points (3-4 s each): they run with
#: the slow tier, the random sample stays (the README test command's budget)
CHAOS_POINTS = "tests/test_chaos.py::test_a_crash_at_each_point_and_a_random_sample_keep_"

#: test files whose subject is the target's side of delivery (a protocol, an adapter's
#: answers and how they are classified and logged): the store's backend does not change
#: what they prove, so their PostgreSQL variants run with the slow campaigns and their
#: SQLite variants in the default run (their store operations are tested on both
#: backends elsewhere)
TARGET_SIDE_FILES = (
    "tests/test_http_target_v2.py",  # 21 s of PostgreSQL variants
    "tests/test_http_target.py",  # 12 s
    "tests/test_failure_reasons.py",  # 11 s
    "tests/test_max_read.py",
    "tests/test_pgtable_cli.py",  # the table target is the subject; 6 s
    "tests/test_dedupe_resend.py",  # the resend rule's store operation: test_store_contract
    "tests/test_resolve_all.py",  # 12 s; its store operations: test_query_plans, both
    "tests/test_pacing.py",  # 4 s, with test_pacing_dispatch.py
    "tests/test_pacing_dispatch.py",
)

#: test files whose subject is the process, not the store (signals, logs, the systemd
#: protocol, alerts, HTTP hardening, the candidate commands' answers): their PostgreSQL
#: variants run with the slow tier, their SQLite variants by default (the README test
#: command's budget: about 30 s of test time); the tests of these files whose PostgreSQL
#: variant proves something of PostgreSQL's (its lock, its DSN's password, its
#: transactions under a crash) stay in the default run on both (``STORE_SIDE_TESTS``)
PROCESS_SIDE_FILES = (
    "tests/test_runner_signals.py",  # 10 s of PostgreSQL variants
    "tests/test_operator_logs.py",  # 5 s
    "tests/test_systemd_notify.py",  # 4 s
    "tests/test_alerts.py",  # 3 s
    "tests/test_http_hardening.py",  # 4 s
    "tests/test_candidate_cli.py",  # 5 s; the candidate store: test_candidate_store, both
)
STORE_SIDE_TESTS = (
    "::test_start_refused_while_another_worker_runs[",
    "::test_banner_says_what_runs_and_never_a_password[",
    "::test_log_lines_never_carry_the_dsn_password[",
    "::test_crash_before_decision_leaves_it_promoting_then_the_sweep_rejects_it[",
    "::test_crash_after_decision_then_the_sweep_promotes_it[",
)

#: the campaigns of the slow tier: many episodes, each with parallel jobs or processes of
#: its own, CPU-bound; .ci/run runs them one at a time (``-m campaign -n 0``) after the
#: other slow tests, which run in parallel like the default run
CAMPAIGNS = (
    "tests/test_chaos.py::test_chaos_seeded_runs_keep_every_invariant",
    "tests/test_chaos.py::test_chaos_over_http_seeded_runs_keep_every_invariant",
    "tests/test_kill9.py::test_kill9_accounting_loses_and_duplicates_nothing",
    "tests/test_kill9.py::test_kill9_over_http_with_server_faults_loses_and_duplicates_nothing",
    "tests/test_kill9.py::test_kill9_at_the_default_batch_leaves_nothing_uncertain",
    "tests/test_kill9_http.py::test_every_request_answered_200_is_stored_once",
    "tests/test_pipeline_processes.py::test_four_worker_processes_share_a_backlog_none_lost_",
    "tests/test_disk_full.py::test_a_real_full_filesystem",
    # (the PostgreSQL countdown and the 100 refused workers are slow but not CPU-bound
    # campaigns, and the hypothesis run of the delivery model is one process on one
    # core: they run with the parallel slow tests)
    # the store-memory campaigns of issue 30 at their smallest sizes (bench/forget.py)
    "tests/test_forget.py::",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``LONG_VARIANTS`` slow before ``-m`` selects."""
    for item in items:
        if item.nodeid.startswith(LONG_VARIANTS) or (
                item.nodeid.startswith(TARGET_SIDE_FILES) and "[postgres" in item.nodeid) or (
                item.nodeid.startswith(PROCESS_SIDE_FILES) and "[postgres" in item.nodeid
                and not any(name in item.nodeid for name in STORE_SIDE_TESTS)) or (
                item.nodeid.startswith(CHAOS_POINTS) and "[sqlite-random" not in item.nodeid):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith(CAMPAIGNS) and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.campaign)


def pytest_sessionstart(session: pytest.Session) -> None:
    """In the main process: compact the server's catalogs if earlier runs left them
    bloated (``pg.tidy_catalogs``)."""
    if not hasattr(session.config, "workerinput") and pg.availability() is None:
        pg.tidy_catalogs()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the PostgreSQL schemas this test process made, in batches (``pg.drop_later``),
    then, in the main process once every test process has dropped its own, compact the
    catalogs those schemas churned."""
    pg.drop_pool()
    pg.drop_left()
    if not hasattr(session.config, "workerinput") and pg.availability() is None:
        pg.tidy_catalogs()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A private (0700) directory, as runner expects for its store."""
    d = tmp_path / "work"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return d


@pytest.fixture
def scope() -> Scope:
    return Scope.model_validate(SCOPE)


@pytest.fixture
def scope_file(workdir: Path) -> Path:
    return write_json(workdir / "scope.json", SCOPE)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every test that takes a store runs once per backend.  PostgreSQL tests skip with
    the reason when the server is unreachable (fail under RUNNER_REQUIRE_POSTGRES=1)."""
    if request.param == "postgres":
        pg.require()
    return str(request.param)


@pytest.fixture
def new_location(backend: str, workdir: Path) -> Iterator[Callable[[str], str]]:
    """Makes fresh store locations: a file in ``workdir``, or an isolated PostgreSQL
    schema that is dropped when the test process ends (``pg.drop_later``)."""
    schemas: list[str] = []

    def make(name: str = "queue") -> str:
        if backend == "sqlite":
            return str(workdir / f"{name}.db")
        schemas.append(pg.new_schema())
        return pg.location(schemas[-1])

    yield make
    pg.drop_later(schemas)


@pytest.fixture
def db_location(backend: str, workdir: Path) -> Iterator[str]:
    """Where a new store lives, for each backend: a file in ``workdir`` that does not
    exist yet, or a PostgreSQL schema that holds an empty, migrated store with no scope
    pinned yet (from this test process's pool, ``pg.pooled_schema``: a store's DDL costs
    350 ms, emptying a used one a few).  A test of creating a store takes
    ``new_location``."""
    if backend == "sqlite":
        yield str(workdir / "queue.db")
        return
    schema = pg.pooled_schema()
    yield pg.location(schema)
    pg.give_back(schema)


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A PostgreSQL store from this test process's pool (skipped without a server): an
    empty, migrated schema with no scope pinned, given back after the test."""
    pg.require()
    schema = pg.pooled_schema()
    yield pg.location(schema)
    pg.give_back(schema)


@pytest.fixture
def missing_location(new_location: Callable[[str], str]) -> str:
    """Where no store is yet, for each backend: for tests that a command creates none."""
    return new_location("queue")


@pytest.fixture
def sqlite_only(backend: str) -> None:
    """For tests of SQLite file specifics (modes, mountinfo, integrity_check, files)."""
    if backend != "sqlite":
        pytest.skip("SQLite file specifics: not applicable to PostgreSQL")


@pytest.fixture
async def store(db_location: str, scope: Scope) -> AsyncIterator[Store]:
    async with await open_store(db_location, scope=scope) as opened:
        yield opened


@pytest.fixture
def cli_store(workdir: Path, scope_file: Path, db_location: str) -> CliStore:
    """A store per backend, driven through the CLI (in process; a crash in a process)."""
    return CliStore(workdir, scope_file, db_location)
