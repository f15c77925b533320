"""Each finding's saving as time per step, of the step the report shows (the step at the run's pace, run.step_s):
saving_s in findings.json, and "before → ~after ms/step (≈N×)" in the terminal summary and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor import Finding, Run, rule
from gpudoctor.engine import run_rules
from gpudoctor.report import build_report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html, to_text
from gpudoctor.report.units import seconds, step_after
from gpudoctor.testing import BundleBuilder


@rule("TEST101", "half-the-step", category="data_starvation")
def half_the_step(run: Run) -> object:
    """Half of every step.

    What it detects: a test.

    Why it matters: tests.

    Fix: none.
    """
    yield Finding("half of the step goes", impact=0.5, fix="none")


def bursty(tmp_path: Path) -> Run:
    """A loader that starves in bursts: after the window, three steps fed from its queue (20 ms), then one that
    waits for its workers (340 ms); the step right after the window carries the trace's export (900 ms)."""
    b = BundleBuilder(tmp_path, window=(1, 1, 4))
    b.step(wall_s=2.0, window="waiting")
    b.step(wall_s=0.2, window="warmup")
    b.steps(4, wall_s=0.02)
    b.step(wall_s=0.9, window="closed")
    b.steps(12, wall_s=lambda i: 0.34 if i % 4 == 3 else 0.02, window="closed")
    return b.build()


def test_saving_is_the_impact_of_the_step_at_the_runs_pace(tmp_path: Path) -> None:
    run = bursty(tmp_path)
    [finding] = run_rules(run, [half_the_step]).findings
    assert finding.saving_s == 0.05  # half of the mean step after the window, 100 ms; not of the 20 ms median
    report = build_report(run, run_rules(run, [half_the_step]))
    assert report["findings"][0]["saving_s"] == 0.05
    facts = report["run"]
    assert (facts["step_s"], facts["step_s_basis"], facts["step_s_steps"]) == (pytest.approx(0.1), "unprofiled", 12)
    assert facts["median_step_s"] == pytest.approx(0.02)
    text = to_text(report)
    assert "step 100.0 ms (the mean of 12 steps after the profiling window); half the steps took under 20.0 ms" in text
    assert "(fix saves ~50%: 100.0 → ~50.0 ms/step (≈2.0×))" in text
    html = to_html(link_outputs(report, tmp_path))
    assert "100.0 → ~50.0 ms/step (≈2.0×)" in html
    assert "half the steps took under 20.0 ms: the savings are of the step at the run's pace" in html


def test_with_few_steps_after_the_window_the_step_is_the_analysed_steps_mean(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=lambda i: [0.08, 0.1, 0.1, 0.3, 0.12][i])
    run = b.build()
    [finding] = run_rules(run, [half_the_step]).findings
    assert finding.saving_s == 0.07  # half of the mean, 140 ms: the 300 ms step is a step the run took
    facts = build_report(run, run_rules(run, [half_the_step]))["run"]
    assert (facts["step_s"], facts["step_s_basis"], facts["step_s_steps"]) == (pytest.approx(0.14), "analysed", 5)
    assert facts["median_step_s"] == pytest.approx(0.1)


@rule("TEST102", "cost-unknown", category="data_starvation")
def cost_unknown(run: Run) -> object:
    """Cost unknown.

    What it detects: a test.

    Why it matters: tests.

    Fix: none.
    """
    yield Finding("something", impact=None, impact_reason="not measured here")


def test_a_finding_without_an_impact_has_no_saving(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(3)
    run = b.build()
    [finding] = run_rules(run, [cost_unknown]).findings
    assert finding.impact is None and finding.saving_s is None
    assert "saves" not in to_text(build_report(run, run_rules(run, [cost_unknown])))


def test_the_phrase_reads_in_the_units_of_the_step() -> None:
    assert step_after(0.0357, 0.0186) == "35.7 → ~17.1 ms/step (≈2.1×)"
    assert step_after(2.5, 1.0) == "2.50 s → ~1.50 s/step (≈1.7×)"
    assert step_after(0.004, 0.0038) == "4.0 ms → ~200 µs/step (≈20×)"
    assert step_after(0.3064, 0.3036) == "306.4 → ~2.8 ms/step (≈109×)"  # no ceiling on a saving
    assert step_after(0.1, 0.1) == "100.0 ms → ~0 µs/step (all of it)"


def test_warm_up_and_start_up_steps_never_enter_the_figures(tmp_path: Path) -> None:
    # A window that recorded no active step (it failed, or the script ended first): the analysed steps are those
    # after start-up, without the profiler's slow warm-up ones.
    b = BundleBuilder(tmp_path, window=(1, 2, 3))
    b.step(wall_s=0.9, window="waiting")  # start-up
    b.steps(2, wall_s=0.5, window="warmup")
    b.steps(3, wall_s=0.1, window="closed")
    run = b.build()
    assert [s.window for s in run.steps] == ["closed"] * 3
    assert build_report(run, run_rules(run, []))["run"]["median_step_s"] == pytest.approx(0.1)


def _contended_starved(tmp_path: Path, *, others: float, delay: float, main_cores: float) -> Run:
    """A CPU run on 2 cores beside other programs (`others` of them): 400 ms steps, 150 ms of each waiting for a
    loader in the main process; the main thread waits for a core `delay` of the time and uses `main_cores`."""
    b = BundleBuilder(tmp_path)
    b.env(cores=2)
    b.loader(num_workers=0, batch_size=16)
    b.steps(20, wall_s=0.4, data_wait_s=0.15)
    b.process(main_cores, run_delay_share=delay)
    b.host_samples(other_cores=others)
    return b.build()


def test_savings_together_never_promise_a_step_shorter_than_its_own_work(tmp_path: Path) -> None:
    """GD504 (other programs' CPU) and GD101 (the loader in the main process) both claim the wait: counted once,
    their sum stays within the step less the main thread's own work; and GD504 alone never promises a step
    shorter than the main thread's CPU per step (once it printed "201.0 ms → ~0 µs/step (≈614719.7×)")."""
    from gpudoctor.analysis.shares import work_floor_s
    from gpudoctor.engine import builtin_rules

    for name, others, delay, cores in (("loaded", 1.7, 0.82, 0.15), ("absurd", 1.94, 0.99, 0.06)):
        run = _contended_starved(tmp_path / name, others=others, delay=delay, main_cores=cores)
        own = run.host.main_thread_cpu_s
        assert own == pytest.approx(cores * 0.4, rel=0.05), name
        result = run_rules(run, builtin_rules())
        found = {f.code: f for f in result.findings}
        assert {"GD101", "GD504"} <= set(found), (name, sorted(found))
        contention = found["GD504"].impact
        assert contention is not None and 0 < contention <= 1 - own / 0.4 + 1e-3, (name, contention)
        total = sum(f.impact or 0.0 for f in result.findings if f.severity != "info")
        floor = work_floor_s(run)
        assert floor is not None and total <= 1 - floor / 0.4 + 1e-3, (name, total, floor)
        text = to_text(build_report(run, result))
        assert "~0 µs/step" not in text and "all of it" not in text, text
        after = 0.4 * (1 - total)
        assert f"down to ~{seconds(after)}" in text.splitlines()[0], text


def test_a_cpu_runs_problems_without_a_cost_are_said_without_a_gpu(tmp_path: Path) -> None:
    """After GD101's fix on a CPU run, what is left may have no estimated cost: the verdict says what was found,
    not "GPU activity not measured; 1 problem"."""
    b = BundleBuilder(tmp_path)
    b.steps(3)
    run = b.build()
    verdict = build_report(run, run_rules(run, [cost_unknown]))["summary"]["verdict"]
    assert verdict == "1 problem; its cost of each 100.0 ms step is not estimated: something.", verdict
    assert "GPU" not in verdict
