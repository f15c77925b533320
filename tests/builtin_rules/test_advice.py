"""Advice fitted to the run: a fix names only settings that apply to this machine, and `rules explain` says how a
rule's severity is chosen."""

from __future__ import annotations

from pathlib import Path

from conftest import Gpudoctor
from gpudoctor.testing import BundleBuilder, assert_fires


def _starved(tmp_path: Path, *, gpu: bool) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    b.steps(8, wall_s=0.1, data_wait_s=0.07, gpu_busy_s=0.02 if gpu else None)
    b.process(1.0)
    return b


def test_pinned_batches_are_suggested_only_when_the_script_uses_a_gpu(tmp_path: Path) -> None:
    on_gpu = assert_fires("GD101", _starved(tmp_path / "gpu", gpu=True).build())[0]
    on_cpu = assert_fires("GD101", _starved(tmp_path / "cpu", gpu=False).build())[0]
    assert "pin_memory=True" in on_gpu["fix"] and "num_workers=" in on_gpu["fix"]
    assert "pin_memory" not in on_cpu["fix"] and "num_workers=" in on_cpu["fix"]


def test_rules_explain_says_how_the_severity_is_chosen(gd: Gpudoctor) -> None:
    explained = gd.run("rules", "explain", "GD101")
    assert explained.returncode == 0
    assert "(data_starvation, warning by default, see Severity below)" in explained.stdout
    severity = "Severity: critical when the GPU idles at least half of each step waiting for data, else warning."
    assert severity in explained.stdout
    fixed = gd.run("rules", "explain", "GD201")
    assert "(blocking_copy, warning) from built-in" in fixed.stdout
