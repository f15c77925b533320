"""What the fixes do together, as the verdict says it (report.together): a measured try replaces the prediction of
the fix it applied, and what is left is sized on the step it measured, from the try's own run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from gpudoctor.bundle.findings import FindingLocation, FindingRecord, Tried
from gpudoctor.pipeline import Diagnosis, RuleSelection, diagnose, prepare_rules
from gpudoctor.pipeline.diagnosis import left_after_lead_try
from gpudoctor.pipeline.writing import report_of
from gpudoctor.remedy import OptimizerRemedy, Remedy
from gpudoctor.report.together import headline, left_after
from gpudoctor.testing import BundleBuilder

ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >"
TRITON = "triton_poi_fused_add_mul_sigmoid_0"


def launch_bound(path: Path, kernel_name: str, step_s: float) -> None:
    """Launch-bound steps: 100 kernels of 2 µs each, the GPU busy 4% of a step."""
    b = BundleBuilder(path, window=(2, 1, None))
    b.steps(10, wall_s=step_s, gpu_busy_s=0.04 * step_s, kernels=100, kernel_name=kernel_name)
    b.forward_site("Model", site=("train.py", 50, "main"))
    b.build()


def tried_diagnosis(tmp_path: Path, try_kernels: str, try_step_s: float = 0.002) -> Diagnosis:
    """An eager launch-bound run whose compile fix (GD313's, and GD301's) was tried: the try's run, in
    tries/GD313, steps in `try_step_s` launching `try_kernels`."""
    launch_bound(tmp_path, ELEMENTWISE, 0.005)
    launch_bound(tmp_path / "tries" / "GD313", try_kernels, try_step_s)
    diagnosis = diagnose([tmp_path], prepare_rules(RuleSelection()))
    tried = Tried(status="measured", applied='torch.compile(Model, backend="inductor")', step_s=try_step_s,
                  speedup=0.005 / try_step_s, steps=8, bundle="tries/GD313")
    with_tries = [msgspec.structs.replace(f, tried=tried) if f.remedy == Remedy(compile="inductor") else f
                  for f in diagnosis.findings]
    return diagnosis.with_findings(with_tries)


def test_the_fix_two_findings_share_is_one_claim_and_its_try_leads(tmp_path: Path) -> None:
    diagnosis = tried_diagnosis(tmp_path, TRITON)
    found = {f.code: f for f in diagnosis.findings}
    # 100 elementwise kernels one after another: compiled, one kernel, and the launches' idle all saved
    assert found["GD313"].impact == pytest.approx(0.96, abs=0.01) and found["GD301"].impact is None
    left = left_after_lead_try(diagnosis)
    assert left is not None and left.code == "GD313" and left.step_s == pytest.approx(0.002)
    # compiled, the step is still launch-bound: what is left is GD301's CUDA graphs, a fix of its own and unsized
    [rest] = left.findings
    assert rest.code == "GD301" and rest.remedy is None and "reduce-overhead" in rest.fix and rest.impact is None
    verdict = headline("2 problems.", 0.005, diagnosis.findings, left)
    assert verdict == ("Tried GD313's fix: measured 5.0 → 2.0 ms/step, 2.5× (predicted ~200 µs). With it, 1 problem "
                       f"is left, its cost not estimated: {rest.title}.")


def test_what_a_try_leaves_is_sized_on_the_step_it_measured() -> None:
    tried = Tried(status="measured", step_s=0.018, speedup=0.0358 / 0.018, steps=50, bundle="tries/GD312")
    lead = msgspec.structs.replace(_problem("GD312", "optimizer", "Adam per tensor", 0.47), tried=tried,
                                   saving_s=0.47 * 0.0358,
                                   remedy=Remedy(optimizer=OptimizerRemedy(at="train.py:20")))
    launches = _problem("GD301", "small_batch", "Launch-bound steps", 0.4)
    left = left_after(lead, [launches], 0.018)
    verdict = headline("2 problems; fixing them saves ~90% of each 35.8 ms step, down to ~3.4 ms.", 0.0358, [lead],
                       left)
    assert verdict == ("Tried GD312's fix: measured 35.8 → 18.0 ms/step, 1.99× (predicted ~19.0 ms). With it, 1 "
                       "problem is left: fixing it saves ~40% more of the 18.0 ms step, down to ~10.8 ms (estimated).")


def test_a_try_whose_own_run_finds_the_same_fix_again_leaves_nothing(tmp_path: Path) -> None:
    """The try's run, read back, still looks eager (its kernels named as eager ones): GD313 and GD301 ask for the
    compile fix it applied. That is no problem left, and no combined step below the measured one is said."""
    diagnosis = tried_diagnosis(tmp_path, ELEMENTWISE)
    left = left_after_lead_try(diagnosis)
    assert left is not None and left.findings == ()
    verdict = headline("2 problems.", 0.005, diagnosis.findings, left)
    assert verdict.endswith("With it, gpudoctor finds no other problem in the run it measured.")


def test_the_report_says_what_the_try_left_and_findings_json_holds_it(tmp_path: Path) -> None:
    diagnosis = tried_diagnosis(tmp_path, TRITON)
    report = report_of(dataclasses.replace(diagnosis, left=left_after_lead_try(diagnosis)))
    after = report["summary"]["after_try"]
    assert after["code"] == "GD313" and after["bundle"] == "tries/GD313"
    assert [f["code"] for f in after["findings"]] == ["GD301"] and after["saving"] == 0
    assert "With it, 1 problem is left" in report["summary"]["verdict"]


def test_a_try_whose_run_cannot_be_read_gives_the_other_problems_as_sized_before_it() -> None:
    def finding(code: str, impact: float, remedy: Remedy | None, tried: Tried | None = None) -> FindingRecord:
        return FindingRecord(code=code, name="x", category="optimizer", severity="warning", title=f"{code} title",
                             impact=impact, saving_s=impact * 0.0358, evidence=[], location=None, fix="f",
                             remedy=remedy, tried=tried)

    tried = Tried(status="measured", step_s=0.018, speedup=0.0358 / 0.018, steps=50, bundle="tries/GD312")
    fused = Remedy(optimizer=OptimizerRemedy(at="train.py:20"))
    findings = [finding("GD312", 0.47, fused, tried), finding("GD301", 0.43, Remedy(compile="inductor"))]
    verdict = headline("2 problems; fixing them saves ~90% of each 35.8 ms step, down to ~3.4 ms.", 0.0358,
                       findings, None)
    assert verdict == ("Tried GD312's fix: measured 35.8 → 18.0 ms/step, 1.99× (predicted ~19.0 ms). Sized on the "
                       "35.8 ms step before it, the other problems save: GD301 ~43% (estimated).")
    assert "3.4 ms" not in verdict  # no combined step from the prediction the try replaced


def _problem(code: str, category: str, title: str, impact: float | None) -> FindingRecord:
    return FindingRecord(code=code, name="x", category=category, severity="warning", title=title, impact=impact,
                         impact_reason=None if impact else "not of each step", evidence=[],
                         location=FindingLocation(file="/w/train.py", line=312, function="main"), fix="f")


def test_a_cost_outside_the_steps_pace_stands_in_the_verdict_with_its_size(tmp_path: Path) -> None:
    """An evaluation every 100th step, which the step at the run's pace leaves out, is said with its share beside
    what the per-step fixes save, and alone instead of a bare count."""
    from gpudoctor.report.verdict import verdict

    b = BundleBuilder(tmp_path)
    b.steps(3, wall_s=0.0142)
    steps = b.build().steps
    stall = _problem("GD701", "periodic_stall",
                     "Every 100th step stalls 868 ms in an evaluation: 39% of the steps' time", None)
    sync = _problem("GD211", "sync_point", "A sync in each step", 0.2)
    both = verdict(0.11, [sync, stall], steps, "problems", step_s=0.0142, cwd="/w")
    assert both == ("2 problems; fixing the one sized per step saves ~20% of each 14.2 ms step, down to ~11.4 ms. "
                    "Not in that figure: "
                    "every 100th step stalls 868 ms in an evaluation: 39% of the steps' time (train.py:312).")
    alone = verdict(0.11, [stall], steps, "problems", step_s=0.0142, cwd="/w")
    assert alone == ("GPU idle 11% of each 14.2 ms step; 1 problem, not a cost of each step: every 100th step stalls "
                     "868 ms in an evaluation: 39% of the steps' time (train.py:312).")
    unsized = _problem("GD301", "small_batch", "Launch-bound steps", None)
    assert verdict(0.5, [unsized], steps, "problems", step_s=0.0142) == "GPU idle 50% of each 14.2 ms step; 1 problem."


def test_evidence_that_was_not_measured_is_not_shown_as_none(tmp_path: Path) -> None:
    """A rule's evidence value None (a batch size it could not read) is left off the page, not shown as "None"."""
    from gpudoctor.report.model import link_outputs
    from gpudoctor.report.render import to_html

    diagnosis = tried_diagnosis(tmp_path, TRITON)
    report = report_of(diagnosis)
    launch_bound = next(f for f in report["findings"] if f["code"] == "GD301")
    assert any(e["value"] is None for e in launch_bound["evidence"])  # findings.json keeps it, as null
    assert ">None<" not in to_html(link_outputs(report, tmp_path))
