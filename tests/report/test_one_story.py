"""One step figure per run: on every recorded fixture the headline, each finding's saving, the budget, the phase
table and the terminal summary give the step at the run's pace (`run.step_s`), and the headline's saving is the
findings' own."""

from __future__ import annotations

import functools
import re

import pytest

from gpudoctor.engine import diagnose_windows
from gpudoctor.pipeline import PreparedRules, RuleSelection, prepare_rules
from gpudoctor.report import build_report
from gpudoctor.report.document import Report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html, to_text
from gpudoctor.report.units import seconds
from gpudoctor.testing import available_fixtures, load_fixture

FIXTURES = available_fixtures()


@functools.cache
def _built_in_rules() -> PreparedRules:
    return prepare_rules(RuleSelection())


def report_of(name: str) -> Report:
    """The report of a recorded fixture, diagnosed by the built-in rules."""
    prepared = _built_in_rules()
    run = load_fixture(name)
    diagnosis = diagnose_windows(run, prepared.rules, prepared.options, prepared.limits)
    return build_report(diagnosis.run, diagnosis.result, {r.code: r.doc for r in prepared.rules}, diagnosis.windows)


@pytest.mark.parametrize("name", FIXTURES)
def test_every_figure_of_the_step_is_the_runs_pace(name: str) -> None:
    report = report_of(name)
    step = report["run"]["step_s"]
    assert step, name
    budget = report["run"].get("budget")
    if budget:
        assert budget["step_s"] == pytest.approx(step, rel=1e-6)
    assert report["breakdown"]["mean_step_s"] == pytest.approx(step, rel=1e-6)
    for finding in report["findings"]:
        if finding["impact"] is not None:
            assert finding["saving_s"] == pytest.approx(finding["impact"] * step, rel=1e-3, abs=2e-6), finding["code"]
    summary = to_text(report).splitlines()
    assert f"step {seconds(step)}" in summary[1], summary[1]
    assert "x the others" not in summary[1] and "median step" not in summary[1]


@pytest.mark.parametrize("name", FIXTURES)
def test_the_headline_says_what_the_fixes_save_of_that_step(name: str) -> None:
    report = report_of(name)
    step, verdict = report["run"]["step_s"], report["summary"]["verdict"]
    problems = [f for f in report["findings"] if f["severity"] != "info"]
    total = min(1.0, sum(f["impact"] or 0.0 for f in problems))
    if problems and total > 0:
        said = re.search(r"saves ~(\d+)% of each (.+?) step, down to ~(.+?)\.(?: Not in that figure: |$)", verdict)
        assert said is not None, verdict
        assert int(said.group(1)) == round(total * 100) and said.group(2) == seconds(step)
        assert said.group(3) == seconds(step * (1 - total))
        assert "GPU idle" not in verdict  # a reader in a hurry would take the idle share for the cost
    else:
        assert f"of each {seconds(step)} step" in verdict or "GPU activity not measured" in verdict, verdict


def test_the_worker_starts_of_each_epoch_are_the_budgets_stalls_and_the_start_ups_finding(tmp_path) -> None:
    """startup_workers_bad: 128 workers started again at each epoch make its 145 ms mean step; the budget gives that
    time to its own slice, which GD702 claims, and the launch-bound steps between (GD301) keep only theirs."""
    report = report_of("startup_workers_bad")
    slices = {s["slice"]: s for s in report["run"]["budget"]["slices"]}
    assert slices["stall"]["share"] > 0.9 and slices["stall"]["claimed_by"] == ["GD702"]
    launch_bound = next(f for f in report["findings"] if f["code"] == "GD301")
    assert launch_bound["impact"] < 0.05 and launch_bound["severity"] == "info"
    assert "stalls now and then" in to_text(report)
    page = to_html(link_outputs(report, tmp_path))
    assert 'class="b-stall"' in page and "steps that stall now and then" in page
