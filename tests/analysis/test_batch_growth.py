"""What a larger batch saves per sample (analysis.batch_growth), and how GD301 and the trace reader carry it."""

from __future__ import annotations

import math

import pytest

from gpudoctor.analysis import Run
from gpudoctor.analysis.batch_growth import MAX_FACTOR, batch_growth, kernel_fills
from gpudoctor.testing import BundleBuilder, assert_fires, load_fixture

H100_WARPS = 64.0  # resident warps an H100 SM holds


def test_a_kernels_fill_is_its_warps_over_the_sms_most() -> None:
    fills = kernel_fills([16.0, 128.0, math.nan, 0.0, 8.0], [0, 0, 0, 0, 1], {0: H100_WARPS})
    assert fills == [0.25, 1.0, None, None, None]  # at most full; no warps, none, or an unknown device: unknown


def test_without_the_fill_a_larger_batch_saves_per_sample_no_more_than_the_idle() -> None:
    # The GPU's work grows with the batch: a 10 ms step with 2 ms of kernels turns GPU-bound at 5x.
    growth = batch_growth(0.010, 0.002, [0.001, 0.001], [None, None], memory_headroom=None)
    assert growth is not None and growth.fill is None
    assert growth.limit == pytest.approx(0.8)
    assert growth.factor == 8 and growth.sample_saving == pytest.approx(0.8)


def test_kernels_that_fill_little_of_the_gpu_take_more_samples_in_the_same_time() -> None:
    # small_batch_bad's shape: a 3 ms step, 2 ms of kernels filling 4% of the GPU.
    growth = batch_growth(0.003, 0.002, [0.001, 0.001], [0.04, 0.04], memory_headroom=None)
    assert growth is not None and growth.fill == pytest.approx(0.04)
    assert growth.limit == pytest.approx(1 - 0.002 * 0.04 / 0.003)
    assert growth.sample_saving > 1 - 0.002 / 0.003  # more than the idle share
    assert growth.sample_saving >= growth.limit - 0.02 and growth.factor < MAX_FACTOR
    assert not growth.memory_bound


def test_the_device_memory_stops_the_growth_and_says_so() -> None:
    growth = batch_growth(0.003, 0.002, [0.001], [0.01], memory_headroom=3.5)
    assert growth is not None and growth.factor == 2 and growth.memory_bound
    assert growth.sample_saving == pytest.approx(0.5)
    assert batch_growth(0.003, 0.002, [0.001], [0.01], memory_headroom=1.5) is None  # no room for twice the batch
    assert batch_growth(0.003, 0.002, [], [], memory_headroom=None) is None  # no kernels


def _launch_bound(tmp_path, warps_per_sm: float | None) -> Run:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.01, gpu_busy_s=0.003, kernels=200, warps_per_sm=warps_per_sm)
    return b.build()


def test_the_reader_keeps_each_kernels_warps_per_sm(tmp_path) -> None:
    run = _launch_bound(tmp_path, 2.0)
    assert {op.warps_per_sm for op in run.require_gpu().kernels} == {2.0}
    assert run.batch_growth is not None and run.batch_growth.fill == pytest.approx(2 / H100_WARPS)


@pytest.mark.parametrize(("warps", "least", "most"), [(2.0, 0.95, 1.0), (None, 0.5, 0.7)])
def test_launch_bound_steps_say_what_a_larger_batch_saves_per_sample(tmp_path, warps, least, most) -> None:
    [finding] = assert_fires("GD301", _launch_bound(tmp_path, warps), count=1)
    saving = {e["name"]: e["value"] for e in finding["evidence"] if e["name"].startswith("saving per sample")}
    [(label, percent)] = saving.items()
    assert least <= percent / 100 <= most, (label, percent)
    factor = label.removeprefix("saving per sample, batch ").removesuffix("× larger")
    assert f"raise the batch size about {factor}×: ~{percent}% less time per sample" in finding["fix"]
    assert finding["impact"] == pytest.approx(0.7, abs=0.03)  # the step's impact stays the idle between launches


def test_the_recorded_small_batch_errs_low_against_its_twin() -> None:
    # small_batch_fixed (64x the batch) took 97% less time per sample on the recording machine.
    growth = load_fixture("small_batch_bad").batch_growth
    assert growth is not None and 0.6 <= growth.sample_saving < 0.97
