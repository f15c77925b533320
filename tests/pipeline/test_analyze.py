"""`gpudoctor analyze`: re-analyse a run directory, or a bare torch.profiler trace made without gpudoctor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import Gpudoctor, Result


def test_analyze_run_dir_rewrites_findings_and_report(gd: Gpudoctor, training_run: Result, bundle_copy: Path) -> None:
    (bundle_copy / "findings.json").write_text("stale")
    (bundle_copy / "report.html").unlink()
    result = gd.run("analyze", str(bundle_copy))
    assert result.returncode == 0, result
    findings = json.loads((bundle_copy / "findings.json").read_text())
    assert findings["run"] == training_run.findings()["run"]
    assert findings["run"]["steps_total"] == 8 and findings["run"]["steps_analysed"] == 2
    assert findings["summary"]["verdict"] in (bundle_copy / "report.html").read_text()
    assert f"report: {bundle_copy / 'report.html'}" in result.stderr


def test_analyze_run_dir_to_another_directory(gd: Gpudoctor, bundle_copy: Path) -> None:
    (bundle_copy / "findings.json").unlink()
    result = gd.run("analyze", str(bundle_copy), "--out", "elsewhere")
    assert result.returncode == 0, result
    assert (gd.cwd / "elsewhere" / "findings.json").is_file() and (gd.cwd / "elsewhere" / "report.html").is_file()
    assert not (bundle_copy / "findings.json").exists()


@pytest.fixture(scope="session")
def bare_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Chrome trace from torch.profiler with a schedule (so it has ProfilerStep#N), made without gpudoctor."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.data import DataLoader, TensorDataset

    path = tmp_path_factory.mktemp("bare") / "trace.json.gz"
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(24, 8)), batch_size=4)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for (inputs,) in loader:
            model(inputs).sum().backward()
            optimizer.step()
            prof.step()
    assert path.is_file()
    return path


@pytest.fixture
def trace_copy(bare_trace: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "traces" / "trace.json.gz"
    copy.parent.mkdir()
    shutil.copy(bare_trace, copy)
    return copy


def _check_trace_report(out_dir: Path) -> dict:
    findings = json.loads((out_dir / "findings.json").read_text())
    assert findings["run"]["trace_only"] is True
    assert findings["run"]["steps_analysed"] == 3  # the schedule's active steps: ProfilerStep#2, #3 and #4
    assert all(row["reason"] for row in findings["not_evaluated"])
    html = (out_dir / "report.html").read_text()
    assert "only a trace was analysed" in html
    assert findings["summary"]["verdict"] in html
    return findings


def test_analyze_bare_trace_writes_next_to_it(gd: Gpudoctor, trace_copy: Path) -> None:
    result = gd.run("analyze", str(trace_copy))
    assert result.returncode == 0, result
    assert "3 steps analysed" in result.stderr
    _check_trace_report(trace_copy.parent)


def test_analyze_bare_trace_to_out(gd: Gpudoctor, trace_copy: Path) -> None:
    result = gd.run("analyze", str(trace_copy), "--out", "report-dir")
    assert result.returncode == 0, result
    _check_trace_report(gd.cwd / "report-dir")
    assert sorted(p.name for p in trace_copy.parent.iterdir()) == ["trace.json.gz"]


def test_analyze_uncompressed_trace(gd: Gpudoctor, trace_copy: Path) -> None:
    import gzip

    plain = trace_copy.with_name("plain_trace.json")
    plain.write_bytes(gzip.decompress(trace_copy.read_bytes()))
    result = gd.run("analyze", str(plain))
    assert result.returncode == 0, result
    _check_trace_report(plain.parent)
