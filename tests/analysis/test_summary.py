"""The figures the report shows, computed in analysis on small built runs: the step breakdown and the per-step bars
(analysis.summary), the bucketed timeline (analysis.timeline) and the kernel-duration histogram (analysis.kernels)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from gpudoctor.analysis import Run
from gpudoctor.analysis.kernels import TOP_KERNELS, kernel_histogram, kernels_in_steps
from gpudoctor.analysis.samples import process_infos
from gpudoctor.analysis.summary import MAX_STEP_ROWS, PHASES, breakdown, median_step_s, step_bars
from gpudoctor.analysis.timeline import MAX_POINTS, Timeline, timeline
from gpudoctor.bundle.samples import ProcEntry, ProcsRow
from gpudoctor.testing import BundleBuilder


def _wall(i: int) -> float:
    return 0.10 + 0.01 * (i % 3)


def _training(path: Path, steps: int = 10, window: tuple[int, int, int | None] = (0, 0, None)) -> BundleBuilder:
    """Steps of 100–120 ms: 20 ms data wait, 30 ms forward, 40 ms backward, 5 ms optimizer, the GPU busy 50 ms."""
    builder = BundleBuilder(path, window=window)
    builder.steps(steps, wall_s=_wall, data_wait_s=0.02, forward_s=0.03, backward_s=0.04, optimizer_s=0.005,
                  gpu_busy_s=0.05, kernels=lambda i: 1 + i % 4)
    return builder


def _no_steps(path: Path) -> Run:
    return BundleBuilder(path).without_trace().build()


# -- the breakdown ---------------------------------------------------------------------------------
def test_an_optimizer_step_that_runs_the_closure_is_counted_once(tmp_path: Path) -> None:
    """Lightning's optimizer.step(closure) runs training_step and backward inside it: a bundle that timed them in
    both phases has its optimizer's own time taken out, and the phases add up to the step, not past it."""
    b = BundleBuilder(tmp_path)
    b.steps(6, wall_s=0.1, data_wait_s=0.01, forward_s=0.02, backward_s=0.03, optimizer_s=0.07, gpu_busy_s=0.05)
    run = b.build()
    assert [s.optimizer_s for s in run.steps] == pytest.approx([0.02] * 6)  # 70 ms less the closure's 50 ms
    shares = {p.phase: p.share for p in breakdown(run.steps).phases}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["optimizer"] == pytest.approx(0.2) and shares["other"] == pytest.approx(0.2)


def test_phases_that_overlap_otherwise_are_fitted_into_the_step(tmp_path: Path) -> None:
    """A sync timed inside the forward pass: never a share of the step shown twice."""
    b = BundleBuilder(tmp_path)
    b.steps(6, wall_s=0.1, data_wait_s=0.04, forward_s=0.05, backward_s=0.02, optimizer_s=0.005, gpu_busy_s=0.05,
            syncs=[{"kind": "item", "count": 1, "host_s": 0.03, "site": {"file": "train.py", "line": 9,
                                                                           "function": "forward"}}])
    shares = {p.phase: p.share for p in breakdown(b.build().steps).phases}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["data_wait"] == pytest.approx(0.4)


def test_the_breakdowns_phases_add_up_to_the_mean_step(tmp_path: Path) -> None:
    run = _training(tmp_path).build()
    result = breakdown(run.steps)
    assert result.mean_step_s == pytest.approx(statistics.fmean(_wall(i) for i in range(10)))
    assert [p.phase for p in result.phases] == list(PHASES)  # in the window every phase is measured
    assert sum(p.mean_s for p in result.phases) == pytest.approx(result.mean_step_s)
    assert sum(p.share for p in result.phases) == pytest.approx(1.0)
    means = {p.phase: p.mean_s for p in result.phases}
    assert means["data_wait"] == pytest.approx(0.02) and means["backward"] == pytest.approx(0.04)


def test_a_phase_no_step_measured_is_left_out_not_zero(tmp_path: Path) -> None:
    """Without a profiling window only data wait is measured: the rest of each step is "other" host time."""
    builder = BundleBuilder(tmp_path, window=(2, 0, 0))
    builder.steps(8, wall_s=0.1, data_wait_s=0.03)
    result = breakdown(builder.build().steps)
    assert [p.phase for p in result.phases] == ["data_wait", "other"]
    assert [p.share for p in result.phases] == pytest.approx([0.3, 0.7])


def test_no_step_gives_no_breakdown_no_bars_and_no_median(tmp_path: Path) -> None:
    run = _no_steps(tmp_path)
    assert run.steps == []
    assert breakdown(run.steps).mean_step_s is None and breakdown(run.steps).phases == ()
    assert step_bars(run.steps) is None and median_step_s(run.steps) is None


def test_the_median_step(tmp_path: Path) -> None:
    run = _training(tmp_path, steps=7).build()
    assert median_step_s(run.steps) == pytest.approx(statistics.median(_wall(i) for i in range(7)))


# -- the per-step bars -----------------------------------------------------------------------------
def test_a_short_run_has_one_bar_per_step(tmp_path: Path) -> None:
    bars = step_bars(_training(tmp_path, steps=6).build().steps)
    assert bars is not None and bars.steps_per_row == 1
    assert [(b.first, b.last) for b in bars.bars] == [(i, i) for i in range(6)]
    assert [b.wall_s for b in bars.bars] == pytest.approx([_wall(i) for i in range(6)])


def test_many_steps_are_grouped_into_at_most_max_rows_bars_that_cover_every_step(tmp_path: Path) -> None:
    run = _training(tmp_path, steps=100).build()
    bars = step_bars(run.steps)
    assert bars is not None and len(bars.bars) <= MAX_STEP_ROWS and bars.steps_per_row == 3
    assert bars.bars[0].first == 0 and bars.bars[-1].last == 99
    assert all(b.first == a.last + 1 for a, b in zip(bars.bars, bars.bars[1:]))  # consecutive, none skipped
    assert bars.max_s == max(b.wall_s for b in bars.bars)
    # the phases the steps spent time in, in PHASES' order; copies and syncs, which these steps had none of, have
    # no key in the legend
    assert bars.phases == ("data_wait", "forward", "backward", "optimizer", "other") and bars.has_gpu


def test_each_bars_host_phases_add_up_to_its_wall_time_and_its_gpu_time_too(tmp_path: Path) -> None:
    bars = step_bars(_training(tmp_path, steps=12).build().steps, max_rows=5)
    assert bars is not None and len(bars.bars) == 4 and bars.steps_per_row == 3
    for bar in bars.bars:
        assert sum(p.mean_s for p in bar.phases) == pytest.approx(bar.wall_s)
        assert bar.gpu is not None and bar.gpu.busy_s == pytest.approx(0.05, abs=1e-6)
        assert bar.gpu.busy_s + bar.gpu.idle_s == pytest.approx(bar.wall_s, abs=1e-6)
        assert bar.gpu.idle_share == pytest.approx(bar.gpu.idle_s / bar.wall_s)


def test_bars_without_a_trace_have_no_gpu_time(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path)
    builder.steps(5, wall_s=0.1, data_wait_s=0.01)
    builder.without_trace()
    bars = step_bars(builder.build().steps)
    assert bars is not None and not bars.has_gpu and all(b.gpu is None for b in bars.bars)


# -- the timeline ----------------------------------------------------------------------------------
def _checked(result: Timeline | None) -> Timeline:
    """The timeline, with every series, the centres and the step counts one value per bucket."""
    assert result is not None
    buckets = len(result.t)
    assert len(result.steps_per_bucket) == buckets
    assert all(len(s.values) == buckets for panel in result.panels for s in panel.series)
    assert result.t[0] == pytest.approx(result.bucket_s / 2, abs=1e-4)
    return result


def test_a_long_run_has_at_most_max_points_points(tmp_path: Path) -> None:
    builder = _training(tmp_path, steps=1000, window=(100, 5, 20))
    builder.host_samples(other_cores=1.0, interval_s=0.05).gpu_samples(util=60.0, interval_s=0.05)
    run = builder.build()
    result = _checked(timeline(run))
    assert len(result.t) == MAX_POINTS
    assert sum(n or 0 for n in result.steps_per_bucket) == run.step_view.steps_in_run == 1000
    assert [p.key for p in result.panels] == ["gpu", "cpu", "loader"]


def test_a_short_run_has_about_two_samples_a_bucket(tmp_path: Path) -> None:
    builder = _training(tmp_path, steps=20)
    builder.host_samples(interval_s=0.1)
    run = builder.build()
    result = _checked(timeline(run))
    assert len(result.t) == max(len(run.host.samples.host), len(run.step_view.run_steps)) // 2  # the densest series
    assert result.bucket_s * len(result.t) == pytest.approx(result.duration_s)


def test_the_timeline_marks_the_analysed_window(tmp_path: Path) -> None:
    builder = _training(tmp_path, steps=20, window=(5, 2, 6))
    run = builder.host_samples().build()
    result = _checked(timeline(run))
    assert result.window is not None and result.other_windows == ()
    assert 0 < result.window.start < result.window.end < result.duration_s
    assert result.window.end - result.window.start == pytest.approx(sum(s.wall_s for s in run.steps), abs=1e-6)


def test_only_the_gpus_the_run_used_are_drawn(tmp_path: Path) -> None:
    builder = _training(tmp_path, steps=20)
    builder.gpu_samples(util=0.0, gpu=0).gpu_samples(util=75.0, gpu=1)  # GPU 0 idle all along: another job's
    result = _checked(timeline(builder.build()))
    gpu = next(p for p in result.panels if p.key == "gpu")
    assert gpu.max == 100.0 and [(s.key, s.device) for s in gpu.series] == [("gpu0", 1)]
    assert {v for v in gpu.series[0].values if v is not None} == {75.0}


def test_the_cpu_scale_is_the_hosts_cores_and_the_loader_scale_the_longest_wait(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path)
    builder.steps(20, wall_s=0.1, data_wait_s=lambda i: 0.08 if i == 7 else 0.01)
    builder.env(cores=4, cpu_count=16).host_samples(other_cores=2.0, tree_cores=1.0)
    result = _checked(timeline(builder.build()))
    cpu, loader = (next(p for p in result.panels if p.key == key) for key in ("cpu", "loader"))
    assert cpu.max == 16.0 and [s.key for s in cpu.series] == ["tree", "host"]
    assert loader.max == pytest.approx(80.0) and [s.key for s in loader.series] == ["wait", "wait_mean"]


def test_a_run_with_neither_samples_nor_steps_has_no_timeline(tmp_path: Path) -> None:
    assert timeline(_no_steps(tmp_path)) is None


# -- kernel durations ------------------------------------------------------------------------------
def test_the_histograms_counts_add_up_to_the_kernels_in_the_analysed_steps(tmp_path: Path) -> None:
    run = _training(tmp_path, steps=12, window=(3, 2, 5)).build()
    histogram = kernel_histogram(run.gpu, run.steps)
    assert histogram is not None
    analysed = sum(s.kernels or 0 for s in run.steps)  # steps 5 to 9: 2 + 3 + 4 + 1 + 2
    assert histogram.count == sum(b.count for b in histogram.bins) == analysed == 12
    assert histogram.per_step == pytest.approx(12 / 5)
    assert sum(b.count_share for b in histogram.bins) == pytest.approx(1.0)
    assert sum(b.time_share for b in histogram.bins) == pytest.approx(1.0)
    assert sum(b.time_us for b in histogram.bins) == pytest.approx(histogram.total_s * 1e6)
    assert histogram.total_s == pytest.approx(5 * 0.05, abs=1e-6)


def test_each_kernel_lies_in_its_bin_and_the_bins_run_from_the_first_used_to_the_last(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path)
    builder.steps(2, wall_s=0.5)
    builder.kernels([(0, 0.0, 0.5e-6), (0, 0.01, 3e-6), (0, 0.02, 3.5e-6), (1, 0.0, 0.2)])  # 0.5, 3, 3.5 µs; 200 ms
    run = builder.build()
    histogram = kernel_histogram(run.gpu, run.steps)
    assert histogram is not None and histogram.count == 4
    assert histogram.bins[0].lo_us == 0 and histogram.bins[-1].hi_us is None
    assert all(b.lo_us == a.hi_us for a, b in zip(histogram.bins, histogram.bins[1:]))  # contiguous
    counts = {(b.lo_us, b.hi_us): b.count for b in histogram.bins}
    assert counts[(0, 1)] == 1 and counts[(2, 5)] == 2 and counts[(100_000, None)] == 1
    assert sum(counts.values()) == 4
    assert histogram.median_us == pytest.approx(3.25, abs=1e-3)


def test_the_top_kernels_are_those_that_took_the_most_time(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path)
    builder.steps(1, wall_s=1.0)
    # kernel_k runs k times for k ms each: kernel_10 took the most time.
    builder.kernels([(0, (k * 10 + n) / 1000, k / 1000, f"kernel_{k}") for k in range(1, 11) for n in range(k)])
    run = builder.build()
    histogram = kernel_histogram(run.gpu, run.steps)
    assert histogram is not None
    assert [t.name for t in histogram.top] == [f"kernel_{k}" for k in range(10, 10 - TOP_KERNELS, -1)]
    first = histogram.top[0]
    assert first.count == 10 and first.total_s == pytest.approx(0.1) and first.mean_us == pytest.approx(10_000)
    assert first.share == pytest.approx(0.1 / histogram.total_s)
    assert len(kernels_in_steps(run.gpu, run.steps)) == histogram.count == sum(range(1, 11))


def test_no_gpu_activity_gives_no_histogram(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path)
    builder.steps(4, wall_s=0.1)
    run = builder.build()
    assert run.gpu is None and kernel_histogram(run.gpu, run.steps) is None
    assert kernel_histogram(None, []) is None


def test_a_thread_that_ended_before_the_last_sample_still_counts() -> None:
    def row(t: float, threads: dict[str, float]) -> ProcsRow:
        return ProcsRow(t=t, procs=[ProcEntry(pid=10, cpu_s=sum(threads.values()), thread_cpu=threads)])

    rows = [row(0.0, {"10": 0.0}), row(1.0, {"10": 0.1, "11": 0.4}), row(2.0, {"10": 0.2, "11": 0.8}),
            row(4.0, {"10": 0.4})]  # thread 11 ended between the last two samples
    (main,) = process_infos(rows)
    assert main.thread_cores == {"10": 0.1, "11": 0.2}  # CPU seconds over the 4 s sampled
