"""A rule whose data was not collected is "not evaluated", with its reason: never a silent pass.

Each case removes one figure a rule needs from an otherwise complete bundle built in code, and checks the
rule says so in `not_evaluated` (and in findings.json, through the engine) instead of finding nothing.
"""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bundle.samples import HostRow
from gpudoctor.engine import run_rules
from gpudoctor.engine.loading import builtin_rules
from gpudoctor.testing import BundleBuilder, assert_not_evaluated, assert_silent

MB = 1024 * 1024


def _gil_bundle(tmp_path: Path, *, probe: bool) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.thread("feeder-1", native_id=b.pid * 100 + 1)
    b.thread("feeder-2", native_id=b.pid * 100 + 2)
    b.steps(5, wall_s=0.1, gil=0.004 if probe else None)
    b.process(1.0, thread_cores=[0.1, 0.45, 0.45])
    return b


def test_gil_contention_without_the_probes_figures_is_not_evaluated(tmp_path: Path) -> None:
    reason = assert_not_evaluated("GD501", _gil_bundle(tmp_path, probe=False).build(), "GIL probe")
    assert "profiling window" in reason


def test_gil_contention_without_process_samples_is_not_evaluated(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1, gil=0.004)
    assert_not_evaluated("GD501", b.build(), "no process samples")


def test_gil_contention_with_its_data_is_evaluated(tmp_path: Path) -> None:
    assert_silent("GD501", _gil_bundle(tmp_path, probe=True).build(), options={"min_threads": 3})


def _host_rows(count: int, **fields: float) -> list[HostRow]:
    return [HostRow(t=1_000_000.0 - 1 + 0.1 * i, cpu_pct=[10.0, 10.0], **fields) for i in range(count)]


def test_host_memory_without_memory_or_swap_figures_is_not_evaluated(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    b.sample_rows("host", [row.to_json() for row in _host_rows(40)])  # CPU only: no memory, no swap counters
    assert_not_evaluated("GD401", b.build(), "neither swap traffic nor available memory")


def test_host_memory_without_host_samples_is_not_evaluated(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    assert_not_evaluated("GD401", b.build(), "no host samples")


def test_host_memory_with_swap_counters_alone_is_evaluated(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    b.sample_rows("host", [row.to_json() for row in _host_rows(40, swap_in=0, swap_out=0)])
    assert_silent("GD401", b.build())


def test_the_engine_lists_rules_without_their_data_with_the_reason(tmp_path: Path) -> None:
    run = _gil_bundle(tmp_path, probe=False).build()
    result = run_rules(run, builtin_rules())
    reasons = {row.code: row.reason for row in result.not_evaluated}
    assert "GD501" in reasons and "GIL probe" in reasons["GD501"]
    assert "GD501" not in {f.code for f in result.findings} and not result.errors
