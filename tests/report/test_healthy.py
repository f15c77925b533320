""""Healthy" only where the GPU is busy or its idle time is explained: a GPU idle much of the step with no finding
to claim the time is said to be so, with the largest such slice; and a run too short to judge says so."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bundle.events import PauseEvent
from gpudoctor.bundle.records import Site
from gpudoctor.engine import run_rules
from gpudoctor.report import build_report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html, to_text
from gpudoctor.report.verdict import unexplained_idle
from gpudoctor.testing import BundleBuilder


def _idle_steps(tmp_path: Path, busy_s: float) -> BundleBuilder:
    """10 ms steps whose GPU works `busy_s` of each, the rest an idle gap no call overlaps."""
    b = BundleBuilder(tmp_path)
    b.steps(10, wall_s=0.01, gpu_busy_s=busy_s)
    b.host_samples()
    b.gpu_samples(util=50.0)
    return b


def test_a_gpu_idle_that_no_finding_claims_is_not_healthy(tmp_path: Path) -> None:
    run = _idle_steps(tmp_path / "idle", busy_s=0.002).build()
    report = build_report(run, run_rules(run, []))
    summary = report["summary"]
    assert summary["status"] == "unexplained" and summary["healthy"] is False
    verdict = summary["verdict"]
    assert verdict.startswith("GPU idle 80% of each 10.0 ms step, unexplained: no finding says why; the largest part, ")
    assert "no problems found" not in verdict
    html = to_html(link_outputs(report, tmp_path))
    assert "Healthy:" not in html and "none happened" not in html and "No finding explains the GPU's idle" in html
    assert to_text(report).startswith(f"gpudoctor: {verdict}")


def test_a_busy_gpu_with_no_finding_is_healthy(tmp_path: Path) -> None:
    run = _idle_steps(tmp_path, busy_s=0.009).build()
    summary = build_report(run, run_rules(run, []))["summary"]
    assert summary["status"] == "healthy"
    assert summary["verdict"] == "GPU idle 10% of each 10.0 ms step; no problems found."


def _short_run(tmp_path: Path, profiled_s: float, busy_s: float, after_s: float) -> BundleBuilder:
    """14 steps after a window of 6 (and a warm-up step), the profiled ones `profiled_s` long with `busy_s` of GPU
    work, those after the window `after_s`."""
    b = BundleBuilder(tmp_path, window=(2, 1, 6))
    b.steps(2, wall_s=after_s)
    b.steps(7, wall_s=profiled_s, gpu_busy_s=busy_s)
    b.steps(15, wall_s=after_s, window="closed")
    b.host_samples()
    b.gpu_samples(util=50.0)
    return b


def _short(report: dict) -> str:
    [short] = [row["reason"] for row in report["not_measured"] if row["what"] == "the step without the profiler"]
    return short


def test_a_run_too_short_to_judge_says_so(tmp_path: Path) -> None:
    """pytorch/examples' dcgan: 14 steps after a window whose steps the profiler made run 2.85x as long, the GPU idle
    80% of them: neither "healthy" nor a verdict without a word on either."""
    run = _short_run(tmp_path / "dcgan", profiled_s=0.0285, busy_s=0.005, after_s=0.01).build()
    report = build_report(run, run_rules(run, []))
    assert report["summary"]["status"] == "unexplained", report["summary"]
    assert _short(report).startswith("only 14 steps ran after the profiling window, whose steps the profiler made "
                                     "run 2.85× as long: too few to judge the step by")
    # Busy in the window, the steps after it 2.5 times longer: nothing found, and not "healthy" either.
    run = _short_run(tmp_path / "busy", profiled_s=0.01, busy_s=0.0095, after_s=0.025).build()
    report = build_report(run, run_rules(run, []))
    assert report["summary"]["status"] == "partial", report["summary"]
    assert report["summary"]["verdict"].endswith("; no problems found in what was measured.")
    assert "0.40× as long" in _short(report)
    # With enough steps after the window, the same distortion is the profiler's, said, and the run is judged.
    long = _short_run(tmp_path / "long", profiled_s=0.01, busy_s=0.0095, after_s=0.025)
    long.steps(20, wall_s=0.025, window="closed")
    report = build_report(long.build(), run_rules(long.build(), []))
    assert report["summary"]["status"] == "healthy", report["summary"]


def test_an_unclaimed_stall_is_told_at_its_line(tmp_path) -> None:
    """One torch.save of 190 ms among 10 ms steps: too few for GD701, yet 43% of the steps' time, which the verdict
    names as the GPU's unexplained idle, at the save's line."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    for i in range(32):
        b.step(wall_s=0.2 if i == 20 else 0.01, gpu_busy_s=0.009)
        if i == 20:
            b.event(PauseEvent(cause="save", step=i, seconds=0.19, site=Site(file="train.py", line=60,
                                                                            function="main")))
    found = unexplained_idle(b.build(), [])
    assert found is not None and "stall" in found.label and found.slice_share > 0.3
    assert found.where is not None and (found.where.file, found.where.line) == ("train.py", 60)
