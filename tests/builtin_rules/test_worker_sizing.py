"""How many DataLoader workers GD101 suggests, by what loading a batch waits on (analysis/loader_cpu.py): a loader
that mostly waits on I/O gets more workers than the cores, one that keeps a core busy stays within the rank's
share. On bundles built in code; tests/trying/test_worker_sizing_runs.py profiles a sleeping and a busy dataset."""

from __future__ import annotations

import pytest

from gpudoctor.analysis import loading_time
from gpudoctor.testing import BundleBuilder, assert_fires

WAIT_S, WALL_S = 0.32, 0.4  # a batch takes 320 ms to load, the step 80 ms of compute: 6 workers hide it


def _starved(tmp_path, *, cpu_s: float | None, cores: int, ranks: int = 1, delay: float = 0.0) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.env(cores=cores, **({"ranks_on_host": ranks} if ranks > 1 else {}))
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    b.process(0.2, run_delay_share=delay)
    b.host_samples()
    b.steps(8, wall_s=WALL_S, data_wait_s=WAIT_S, gpu_busy_s=0.08, data_wait_cpu_s=cpu_s)
    return b


def _workers(tmp_path, **kwargs: object) -> tuple[int, str]:
    [finding] = assert_fires("GD101", _starved(tmp_path, **kwargs).build(), count=1)  # type: ignore[arg-type]
    return finding["remedy"]["loader"]["num_workers"], finding["fix"]


def test_a_loader_that_waits_on_io_gets_more_workers_than_cores(tmp_path) -> None:
    count, fix = _workers(tmp_path, cpu_s=0.01, cores=2)  # 3% of its loading on a core
    assert count == 6 > 2
    assert "loading waits 97% of its time on I/O and uses 3% of a core, so more workers than the 2 cores help" in fix


def test_a_cpu_bound_loader_stays_within_the_cores(tmp_path) -> None:
    count, fix = _workers(tmp_path, cpu_s=0.3, cores=4)  # 94% on a core
    assert count == 3
    assert fix.endswith("3 workers, as many as the 4 cores allow, one kept for the training process")


def test_a_cpu_bound_loader_stays_within_its_ranks_share(tmp_path) -> None:
    count, fix = _workers(tmp_path, cpu_s=0.3, cores=8, ranks=2)
    assert count == 3
    assert "as many as the 4 cores (the host's 8 shared by 2 ranks) allow" in fix


def test_a_loader_waiting_for_a_core_is_not_waiting_on_io(tmp_path) -> None:
    """A training thread held back by other programs waits for a core, not on I/O: workers would wait too."""
    count, _ = _workers(tmp_path, cpu_s=0.1, cores=4, delay=0.6)
    assert count == 3


def test_io_bound_workers_are_held_to_a_few_a_core(tmp_path) -> None:
    b = _starved(tmp_path / "many", cpu_s=0.001, cores=2)
    b.steps(8, wall_s=2.0, data_wait_s=1.9, gpu_busy_s=0.08, data_wait_cpu_s=0.001)  # needs dozens
    [finding] = assert_fires("GD101", b.build(), count=1)
    assert finding["remedy"]["loader"]["num_workers"] == 8
    assert "(at most 4 a core)" in finding["fix"]


def test_a_bundle_without_the_waits_cpu_is_sized_by_the_cores(tmp_path) -> None:
    """Bundles recorded before the training thread's CPU in its waits was: sized as they were."""
    count, _ = _workers(tmp_path, cpu_s=None, cores=4)
    assert count == 3


def test_where_loading_time_comes_from(tmp_path) -> None:
    loading = loading_time(_starved(tmp_path, cpu_s=0.08, cores=2, delay=0.1).build())
    assert loading is not None
    assert (loading.cpu_share, loading.delay_share) == (pytest.approx(0.25), pytest.approx(0.1))
    assert loading.io_share == pytest.approx(0.65) and loading.io_bound
