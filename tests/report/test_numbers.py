"""One set of numbers: a starved run's title, evidence, saving and breakdown tell the same story, of one step."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import Gpudoctor
from gpudoctor.analysis import Run
from gpudoctor.engine import builtin_rules, run_rules
from gpudoctor.report.model import build_report

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "starved_training.py"


def test_a_starved_runs_figures_agree(gd: Gpudoctor) -> None:
    result = gd.profile(str(EXAMPLE), "--samples", "480")
    assert result.returncode == 0, result
    run = Run.from_bundle(result.run_dir)
    report = build_report(run, run_rules(run, builtin_rules()))
    finding = next(f for f in result.findings()["findings"] if f["code"] == "GD101")
    # On a machine without a GPU the title gives the step's own wait ("Each step waits 93% of its time").
    title_share = int(re.search(r"(?:idles|waits) (\d+)% of (?:each step|its time)", finding["title"]).group(1)) / 100
    breakdown = {p["phase"]: p["share"] for p in report["breakdown"]["phases"]}
    evidence = {e["name"]: e["value"] for e in finding["evidence"]}
    assert abs(title_share - breakdown["data_wait"]) <= 0.05, (title_share, breakdown)
    assert "step time" not in evidence  # the run's one step figure is the report's, not said again here
    assert report["breakdown"]["mean_step_s"] == report["run"]["step_s"]  # the phase table's step is the run's pace
    assert finding["saving_s"] == round(finding["impact"] * report["run"]["step_s"], 6)  # of the step shown
    assert finding["impact"] <= title_share + 0.005  # a what-if: never more than the wait it removes (title rounded)
