"""The SPIN model of the delivery protocol (issue 20; ``model/``, docs/model.md).

Two kinds of tests:

* the table that ties the model to the code (``model/steps.toml``) is checked against
  the code and the model, without SPIN: crash points named there exist in
  ``runner.crashpoints.POINTS``, the model's ``CRASH(...)`` points and the table agree,
  every delivery crash point is in the model, and each step's functions exist exactly
  when the step says it is on main;
* SPIN runs the model at small bounds: the five safety properties verify, with a target
  that does not deduplicate, with one that does (SPEC E7), and with one that marks batches
  beside a store that forgets (SPEC E8, ``REWIND=1``; a few seconds each, in the default
  run); the liveness properties and every mutation (each must yield a
  counterexample) are ``slow``.  CI runs ``model/check.py``, which checks the same
  properties and mutations at larger bounds, instead of these (marked ``spin_check``).

Without ``spin`` (or a C compiler) the SPIN tests skip, unless ``RUNNER_REQUIRE_SPIN=1``
or ``CI=true``, which make a missing SPIN a failure.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

from model import check, tables
from runner.crashpoints import POINTS

REQUIRE_ENV = "RUNNER_REQUIRE_SPIN"


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def spin_tools() -> tuple[str, str]:
    try:
        return check.tools()
    except check.Unavailable as exc:
        if _required():
            pytest.fail(f"{exc}; {REQUIRE_ENV}=1 or CI=true requires it")
        pytest.skip(f"{exc}; set {REQUIRE_ENV}=1 to make this a failure")


def _resolve(dotted: str) -> Any:
    """The object a dotted name names (module, then attributes); raises if it does not
    exist."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


# -- the table --------------------------------------------------------------------------


def test_every_crash_point_in_the_table_exists() -> None:
    named = {p for step in check.load_steps() for p in step["crash_points"]}
    missing = sorted(named - set(POINTS))
    assert not missing, (f"model/steps.toml names crash points that runner/crashpoints.py "
                         f"no longer has: {missing}; update the table and the model")


def test_the_model_and_the_table_name_the_same_crash_points() -> None:
    in_model = check.model_crash_points()
    in_table = {p for step in check.load_steps() for p in step["crash_points"]}
    assert in_model - in_table == set(), "CRASH(...) points of the model not in the table"
    assert in_table - in_model == set(), "crash points of the table the model never reaches"


def test_every_delivery_crash_point_is_modelled() -> None:
    delivery = {p for p in POINTS if p.startswith(check.DELIVERY_POINTS)}
    missing = sorted(delivery - check.model_crash_points())
    assert not missing, (f"delivery crash points with no place in model/delivery.pml: "
                         f"{missing}; model the step (or say in docs/model.md why not)")


def test_each_step_names_code_that_exists_exactly_when_it_is_on_main() -> None:
    for step in check.load_steps():
        status = step["status"]
        for name in step["code"]:
            try:
                _resolve(name)
                found = True
            except (ImportError, AttributeError):
                found = False
            if status == "main":
                assert found, f"{name!r} (step {step['step']!r}) no longer exists"
            else:
                assert not found, (f"{name!r} exists now: mark the step {step['step']!r} "
                                   f"as on main instead of {status!r}")


def test_steps_are_complete_rows() -> None:
    for step in check.load_steps():
        assert set(step) == {"step", "model", "code", "crash_points", "status"}, step
        assert step["status"] == "main" or step["status"].startswith(
            ("issue ", "designed, issue ", "the world")), step


def test_each_mutation_names_a_property_the_model_has() -> None:
    formulas = check.ltl_formulas()
    assert set(formulas) == set(tables.PROPERTIES)
    assert {m.breaks for m in tables.MUTATIONS} == set(tables.PROPERTIES)
    text = check.MODEL.read_text(encoding="utf-8")
    for m in tables.MUTATIONS:
        assert f"#ifdef {m.macro}" in text or f"defined({m.macro})" in text or (
            f"#ifndef {m.macro}" in text), m.macro


def _all_checks() -> list[check.Check]:
    return [*check.checks_for(quick=True), *check.checks_for(deep=True)]


def test_a_dedupe_only_property_is_checked_only_with_a_deduplicating_target() -> None:
    for c in _all_checks():
        dedupe = tables.CONFIGS[c.config].defines["DEDUPE"]
        if c.prop in tables.DEDUPE_ONLY and c.mutation is None:
            assert dedupe == 1, c.name
    checked = {c.prop for c in _all_checks() if c.mutation is None
               and tables.CONFIGS[c.config].defines["DEDUPE"] == 1}
    assert checked == set(tables.SAFETY) | set(tables.DEDUPE_ONLY)


def test_each_mutation_runs_on_the_target_it_is_about() -> None:
    """A dedupe mutation with DEDUPE=1, a rewind mutation with REWIND=1 (a target that
    marks, a store that forgets); every other (M_RESEND_NONDEDUPE above all: the rule on a
    target that does not deduplicate) with DEDUPE=0 and REWIND=0, the model as it was."""
    by_macro = {m.macro: m for m in tables.MUTATIONS}
    runs = [c for c in _all_checks() if c.mutation is not None]
    assert {c.mutation for c in runs} == set(by_macro)
    for c in runs:
        defines, m = tables.CONFIGS[c.config].defines, by_macro[str(c.mutation)]
        assert defines["DEDUPE"] == int(m.dedupe)
        assert defines["REWIND"] == int(m.rewind)
        assert defines["PIPELINE"] == int(m.pipeline)
        assert not defines["REWIND"] or defines["MAXFORGET"] >= 1, c.name
        assert not (m.dedupe and m.rewind), m.macro
    assert not by_macro["M_RESEND_NONDEDUPE"].dedupe


def test_the_rewind_variant_checks_the_safety_properties_and_settling() -> None:
    """REWIND=1 (a store that forgets) is checked for the five safety properties in the
    CI run and in the quick one, for every record settling in the CI run, and for never
    two rows also with a crash on top."""
    for quick in (True, False):
        checked = {(c.config, c.prop) for c in check.checks_for(quick=quick)
                   if c.mutation is None and tables.CONFIGS[c.config].defines["REWIND"]}
        props = {p for _, p in checked}
        assert props == set(tables.SAFETY) | (set() if quick else {"every_record_settles"})
        assert all(tables.CONFIGS[c].defines["MAXFORGET"] >= 1 for c, _ in checked)
    assert ("rewind-crash", "no_duplicate_write") in {
        (c.config, c.prop) for c in check.checks_for() if c.mutation is None}


def test_the_pipelined_variant_checks_the_safety_properties_and_liveness() -> None:
    """PIPELINE=1 (issue 32: two batches in flight) is checked for the five safety
    properties in every run; in the CI run for every record settling, and for never two
    rows beside a store that forgets, with a crash; with --deep also with batches of 1
    to 3, on a deduplicating target (every record confirmed too) and beside a store that
    forgets."""
    def checked(**how: bool) -> set[tuple[str, str]]:
        return {(c.config, c.prop) for c in check.checks_for(**how)
                if c.mutation is None and tables.CONFIGS[c.config].defines["PIPELINE"]}

    assert {p for _, p in checked(quick=True)} == set(tables.SAFETY)
    ci = checked()
    assert {("pipeline", p) for p in tables.SAFETY} <= ci
    assert {("pipeline-n2", "every_record_settles"),
            ("pipeline-rewind-crash", "no_duplicate_write")} <= ci
    deep = checked(deep=True)
    assert {p for _, p in deep} == set(tables.SAFETY) | set(tables.LIVENESS)
    for config in ("pipeline-batches", "pipeline-dedupe", "pipeline-rewind"):
        assert {(config, p) for p in tables.SAFETY} <= deep, config


def test_each_mutation_is_a_mutation_a_limit_or_a_finding() -> None:
    """A "finding" is the code on main as it is, which the model shows wrong (the model
    checks its fix): it must give its counterexample like any mutation, and steps.toml
    must have a step of the fix that is not on main yet."""
    assert {m.kind for m in tables.MUTATIONS} <= {"mutation", "limit", "finding"}
    findings = [m for m in tables.MUTATIONS if m.kind == "finding"]
    if findings:
        assert any(s["status"] != "main" and "finding" in s["step"]
                   for s in check.load_steps())


def test_the_recorded_figures_are_from_this_model() -> None:
    """docs/model.md renders the latest bench/results/spin-*.json: it must come from the
    model as it is (``python model/check.py --record`` after changing the model)."""
    import hashlib
    import json

    files = sorted((check.ROOT / "bench" / "results").glob("spin-2*.json"))
    assert files, "no bench/results/spin-*.json: run python model/check.py --record"
    doc = json.loads(files[-1].read_text(encoding="utf-8"))
    assert doc["ok"]
    assert doc["model_sha256"] == hashlib.sha256(check.MODEL.read_bytes()).hexdigest(), (
        f"{files[-1].name} was recorded from another version of model/delivery.pml: "
        "run python model/check.py --record")


# -- SPIN -------------------------------------------------------------------------------


def _expect(outcomes: list[check.Outcome]) -> None:
    bad = [o for o in outcomes if not o.ok]
    assert not bad, "\n".join(f"{o.check}: expected {o.expect}, got {o.result} {o.detail}\n"
                              f"{o.output[-2000:]}" for o in bad)


def test_safety_properties_verify_at_small_bounds(spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    outcomes = check.run_group("small", None, tables.SAFETY, spin=spin, cc=cc)
    _expect(outcomes)
    assert all(o.states_stored and o.states_stored > 10_000 for o in outcomes)


def test_safety_properties_verify_with_a_deduplicating_target_at_small_bounds(
        spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    outcomes = check.run_group("small-dedupe", None, tables.SAFETY, spin=spin, cc=cc)
    _expect(outcomes)
    assert all(o.states_stored and o.states_stored > 10_000 for o in outcomes)


def test_safety_properties_verify_with_a_store_that_forgets_at_small_bounds(
        spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    outcomes = check.run_group("small-rewind", None, tables.SAFETY, spin=spin, cc=cc)
    _expect(outcomes)
    assert all(o.states_stored and o.states_stored > 10_000 for o in outcomes)


def test_safety_properties_verify_with_the_pipelined_dispatch_at_small_bounds(
        spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    outcomes = check.run_group("small-pipeline", None, tables.SAFETY, spin=spin, cc=cc)
    _expect(outcomes)
    assert all(o.states_stored and o.states_stored > 10_000 for o in outcomes)


#: a formula of this test only: never two records in flight at once (2 records)
_ONE_IN_FLIGHT = "ltl one_in_flight { [] !(st[0] == IN_FLIGHT && st[1] == IN_FLIGHT) }"


@pytest.mark.slow
@pytest.mark.parametrize(("config", "pipelines"),
                         [("today-n2", False), ("small-pipeline", True)])
def test_only_the_pipelined_variant_has_two_batches_in_flight(
        spin_tools: tuple[str, str], config: str, pipelines: bool) -> None:
    """The pipelined variant proves something only if it pipelines: with one record per
    request, some state of PIPELINE=1 has two records (two batches) in flight at once;
    PIPELINE=0 has none, in an exhaustive search."""
    spin, cc = spin_tools
    assert tables.CONFIGS[config].defines["BATCH"] == 1
    (outcome,) = check.run_group(config, None, ["one_in_flight"], spin=spin, cc=cc,
                                 extra=_ONE_IN_FLIGHT)
    if pipelines:
        assert outcome.errors and outcome.errors >= 1, outcome.output[-2000:]
    else:
        assert outcome.result == "verified" and outcome.errors == 0, outcome.output[-2000:]


@pytest.mark.slow
@pytest.mark.spin_check
def test_every_record_settles_at_small_bounds(spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    _expect(check.run_group("small", None, ["every_record_settles"], spin=spin, cc=cc))


@pytest.mark.slow
@pytest.mark.spin_check
def test_every_record_is_confirmed_with_a_deduplicating_target_at_small_bounds(
        spin_tools: tuple[str, str]) -> None:
    spin, cc = spin_tools
    _expect(check.run_group("small-dedupe", None, tables.DEDUPE_ONLY, spin=spin, cc=cc))


@pytest.mark.slow
@pytest.mark.spin_check
@pytest.mark.parametrize("mutation", tables.MUTATIONS, ids=lambda m: m.macro)
def test_mutation_yields_a_counterexample(spin_tools: tuple[str, str],
                                          mutation: tables.Mutation) -> None:
    spin, cc = spin_tools
    config = tables.mutation_config(mutation, quick=True)
    (outcome,) = check.run_group(config, mutation.macro, [mutation.breaks], spin=spin, cc=cc)
    _expect([outcome])
    assert outcome.errors and outcome.errors >= 1
