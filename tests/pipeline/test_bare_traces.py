"""A bare torch.profiler trace exported without a schedule has no ProfilerStep ranges: its steps come from the
optimizer's step() calls, which torch annotates in every trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Gpudoctor, checked_findings


@pytest.fixture(scope="module")
def unscheduled_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six SGD steps profiled from start to end, with no schedule and so no ProfilerStep#N."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(6):
            loss = model(torch.randn(4, 8)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    path = tmp_path_factory.mktemp("bare") / "trace.json"
    prof.export_chrome_trace(str(path))
    assert "ProfilerStep#" not in path.read_text()
    return path


def test_an_unscheduled_trace_gets_one_step_per_optimizer_step(gd: Gpudoctor, unscheduled_trace: Path) -> None:
    result = gd.run("analyze", str(unscheduled_trace), "--out", "out")
    assert result.returncode == 0, result
    run = checked_findings(gd.cwd / "out" / "findings.json")["run"]
    assert run["steps_analysed"] == 6 and run["step_source"] == "optimizer"
    assert run["median_step_s"] > 0
    assert run["window_distortion"] is None and "bare trace" in run["window_distortion_reason"]
