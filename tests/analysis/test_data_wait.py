"""The data wait the GPU spends idle: a host that runs ahead of a GPU-bound step waits for batches while the GPU
works through its queue, and that wait costs nothing; the same waits beside a short GPU step do."""

from __future__ import annotations

import pytest

from gpudoctor.analysis import Run
from gpudoctor.engine import builtin_rules, run_rules
from gpudoctor.report.document import Report
from gpudoctor.report.model import build_report, link_outputs
from gpudoctor.report.render import to_html, to_text
from gpudoctor.testing import BundleBuilder, assert_fires, assert_silent

STEP_S, WAIT_S, LAUNCH_AT_S = 0.010, 0.006, 0.008  # each step waits 6 ms for its batch, launches at 8 ms
WINDOW = (2, 0, 4)  # steps 2-5 are profiled


def loop_without_sync(tmp_path, kernel_s: float) -> Run:
    """20 steps of 10 ms on the host, 6 ms of them waiting for data, each launching one kernel of `kernel_s` that
    the GPU runs as soon as the one before it ends (no sync: the host never waits for the GPU)."""
    b = BundleBuilder(tmp_path, window=WINDOW)
    b.env(cores=16)
    b.loader(num_workers=2, batch_size=32, site=("infer.py", 30, "main"))
    b.steps(20, wall_s=STEP_S, data_wait_s=WAIT_S)
    b.workers(2, cores=1.0)
    b.host_samples()
    gpu_free, ops = 0.0, []
    for step in range(WINDOW[0], WINDOW[0] + WINDOW[2]):  # the profiler sees what the window's steps launched
        start = max(b.start + step * STEP_S + LAUNCH_AT_S, gpu_free)
        ops.append({"start": start, "dur": kernel_s})
        gpu_free = start + kernel_s
    b.kernels(ops)
    return b.build()


def test_the_gpu_work_per_step_counts_what_ran_after_the_step_ended(tmp_path) -> None:
    run = loop_without_sync(tmp_path, kernel_s=0.030)
    assert run.gpu_work.per_step_s == pytest.approx(0.030, rel=1e-3)
    assert all(step.gpu_busy_s is not None and step.gpu_busy_s <= STEP_S + 1e-6 for step in run.steps)


def test_a_host_ahead_of_a_gpu_bound_step_waits_for_data_without_idling_the_gpu(tmp_path) -> None:
    run = loop_without_sync(tmp_path, kernel_s=0.030)
    wait = run.data_wait
    assert wait is not None and wait.gpu_bound
    assert wait.wait_s == pytest.approx(WAIT_S) and wait.idle_s == 0.0
    assert run.steady_wait_share == 0.0
    assert run.budget is not None and run.budget.seconds("data_wait") == 0.0
    for code in ("GD101", "GD102", "GD103"):
        assert_silent(code, run)


def test_the_same_waits_beside_a_short_gpu_step_idle_the_gpu(tmp_path) -> None:
    run = loop_without_sync(tmp_path, kernel_s=0.002)
    wait = run.data_wait
    assert wait is not None and not wait.gpu_bound
    assert wait.idle_s == pytest.approx(WAIT_S)  # the GPU's 2 ms leave 8 ms of the step: the whole wait is idle
    assert run.steady_wait_share == pytest.approx(WAIT_S / STEP_S)
    finding = assert_fires("GD102", run, count=1, location="infer.py:30")[0]
    assert "the GPU idles 60% of each step" in finding["title"]


def test_a_wait_longer_than_the_gpu_leaves_free_is_idle_only_past_the_gpu_work(tmp_path) -> None:
    run = loop_without_sync(tmp_path, kernel_s=0.007)
    wait = run.data_wait
    assert wait is not None and not wait.gpu_bound
    assert wait.idle_s == pytest.approx(STEP_S - 0.007, rel=1e-3)  # 3 ms of the 6 ms wait: the GPU works 7 ms of 10


def test_the_report_says_the_host_ran_ahead_of_the_gpu(tmp_path) -> None:
    ahead = build_report_of(loop_without_sync(tmp_path / "ahead", kernel_s=0.030))
    assert ahead["run"]["gpu_work_per_step_s"] == pytest.approx(0.030, rel=1e-3)
    assert ahead["run"]["step_s"] == ahead["run"]["gpu_work_per_step_s"] and ahead["run"]["step_s_basis"] == "gpu_work"
    assert "step 30.0 ms (the GPU's work per step: the host ran ahead of it)" in to_text(ahead)
    assert "<th>Step</th><td>30.0 ms (the GPU&#39;s work per step: the host ran ahead of it)" in to_html(
        link_outputs(ahead, tmp_path / "ahead"))
    behind = build_report_of(loop_without_sync(tmp_path / "behind", kernel_s=0.002))
    assert behind["run"]["gpu_work_per_step_s"] == pytest.approx(0.002, rel=1e-3)
    assert "ran ahead" not in to_text(behind)
    assert "ran ahead" not in to_html(link_outputs(behind, tmp_path / "behind"))


def build_report_of(run: Run) -> Report:
    return build_report(run, run_rules(run, builtin_rules()))
