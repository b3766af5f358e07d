"""Prometheus's own checker on what the docs tell an operator to use (issue 18 point 3 and
"Done when"): ``promtool`` checks the alert rules and the scrape config exactly as the
how-to page shows them (the fenced blocks of ``docs/how-to/serve.md``, read from the
page, not copied), a real ``/metrics`` answer, and, with ``promtool test rules``, that
each alert stays silent when it should and fires when it should (the external negative
alert test the design document listed as untested).

Without ``promtool`` (Debian: ``apt-get install prometheus``) these tests skip, unless
``RUNNER_REQUIRE_PROMTOOL=1``, which makes a missing promtool a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runner.io.faults import Fault
from runner.tasks.outcomes import CycleSummary
from tests.helpers import event
from tests.httpkit import body_of, serving
from tests.test_http_metrics import cycle

pytestmark = pytest.mark.timeout(60)

REQUIRE_ENV = "RUNNER_REQUIRE_PROMTOOL"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "serve.md"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"promtool is not installed; {REQUIRE_ENV}=1 requires it")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); "
                    f"set {REQUIRE_ENV}=1 to make this a failure")
    return found


def docs_block(first_line: str) -> str:
    """The fenced YAML block of the how-to page that opens with ``first_line``, as the
    page shows it."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", PAGE.read_text(encoding="utf-8"),
                        re.MULTILINE | re.DOTALL)
    found = [b for b in blocks if b.splitlines()[0] == first_line]
    assert len(found) == 1, f"{PAGE.name}: expected one yaml block opening {first_line!r}"
    return str(found[0])


def run(promtool: str, *args: str, stdin: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], input=stdin, capture_output=True, text=True,
                          timeout=30, cwd=cwd, check=False)


def test_the_docs_alert_rules_pass_promtool(promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "runner.yml"
    rules.write_text(docs_block("# rules/runner.yml"), encoding="utf-8")
    done = run(promtool, "check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 3 rules found" in done.stdout


def test_the_docs_scrape_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(docs_block("# prometheus.yml"), encoding="utf-8")
    done = run(promtool, "check", "config", "--syntax-only", str(config))
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_real_metrics_answer_passes_promtool(
        promtool: str, db_location: str, workdir: Path) -> None:
    """Every family a scrape can show, with samples: intake answers of several kinds,
    uncertain records (a timed-out send), a cycle's counters."""
    async with serving(db_location, mode="start") as s:
        for i in range(3):
            assert (await s.post(body_of(event(i)))).status_code == 200
        assert (await s.post(body_of(event(0)))).status_code == 200  # duplicate
        assert (await s.post(b"{")).status_code == 400
        assert (await s.post(body_of(event(9, tenant_id="elsewhere")))).status_code == 422
        await cycle(db_location, workdir / "t.db", Fault.TIMEOUT)  # the three: uncertain
        s.service.on_cycle(CycleSummary(dispatched=3, uncertain=3, polled=1))
        response = await s.get("/metrics")
    assert response.status_code == 200
    assert "runner_uncertain_leads 3.0" in response.text
    assert 'runner_cycle_records_total{outcome="uncertain"} 3.0' in response.text
    done = run(promtool, "check", "metrics", stdin=response.text)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_docs_alerts_fire_when_they_should_and_only_then(
        promtool: str, tmp_path: Path) -> None:
    """``promtool test rules`` over synthetic series (one scrape a minute):

    * RunnerUncertainLeads: silent with no uncertain record, silent while the record is
      younger than 15 minutes, pending for its 5 minutes, then firing with the page's
      summary;
    * RunnerStale: silent while cycles complete, firing once none did for 5 minutes (and
      2 minutes pending);
    * RunnerPollFailing: silent for a failing run shorter than 15 minutes, then firing.
    """
    rules_text = docs_block("# rules/runner.yml")
    (tmp_path / "runner.yml").write_text(rules_text, encoding="utf-8")
    description = re.search(r'description: "(.*)"', rules_text)
    assert description is not None
    where = {"job": "runner", "instance": "127.0.0.1:8080"}

    def series(name: str, values: str) -> dict[str, str]:
        labels = ",".join(f'{k}="{v}"' for k, v in where.items())
        return {"series": f"{name}{{{labels}}}", "values": values}

    def alert(at: str, name: str, *firing: dict[str, Any]) -> dict[str, Any]:
        return {"eval_time": at, "alertname": name, "exp_alerts": list(firing)}

    uncertain = {"exp_labels": {"severity": "page"}, "exp_annotations": {
        "summary": "1 lead(s) uncertain for over 15 minutes",
        "description": description.group(1)}}
    tests = {
        "rule_files": ["runner.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                # none uncertain for 20 minutes, then one, accepted at minute 20
                series("runner_uncertain_leads", "0x20 1x40"),
                series("runner_oldest_uncertain_age_seconds", "0x20 60+60x40"),
                # a cycle a minute until minute 10, then none (the loop is stuck)
                series("runner_last_cycle_timestamp_seconds", "0+60x10 600x30"),
                # polls fail from minute 5 to 15, and again from minute 20 on
                series("runner_poll_failing", "0x4 1x10 0x5 1x40"),
            ],
            "alert_rule_test": [
                alert("20m", "RunnerUncertainLeads"),
                alert("34m", "RunnerUncertainLeads"),  # 840 s old: not yet 15 minutes
                alert("38m", "RunnerUncertainLeads"),  # over 15 minutes, pending 5m
                alert("45m", "RunnerUncertainLeads", uncertain),
                alert("12m", "RunnerStale"),
                alert("20m", "RunnerStale", {"exp_labels": {"severity": "page"}}),
                alert("14m", "RunnerPollFailing"),  # failing, but for less than 15m
                alert("19m", "RunnerPollFailing"),  # the run ended
                alert("40m", "RunnerPollFailing", {"exp_labels": {"severity": "ticket"}}),
            ],
        }],
    }
    (tmp_path / "runner_test.yml").write_text(json.dumps(tests, indent=1), encoding="utf-8")
    done = run(promtool, "test", "rules", "runner_test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
