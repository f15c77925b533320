"""`gpudoctor analyze DIR` on what torch.profiler.tensorboard_trace_handler writes: the newest trace, said once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import Gpudoctor, checked_findings

WORKERS = ("worker0", "worker1", "worker2")


@pytest.fixture(scope="session")
def tensorboard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three traces from tensorboard_trace_handler, made without gpudoctor: two plain, the newest gzipped."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    logdir = tmp_path_factory.mktemp("tensorboard") / "log"
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for worker in WORKERS:
        handler = tensorboard_trace_handler(str(logdir), worker_name=worker, use_gzip=worker == WORKERS[-1])
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                     on_trace_ready=handler) as prof:
            for _ in range(5):
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
                prof.step()
    traces = sorted(logdir.iterdir())
    assert [t.name.split(".")[0] for t in traces] == list(WORKERS) and traces[-1].name.endswith(".pt.trace.json.gz")
    for age, trace in enumerate(reversed(traces)):  # worker2's is the newest, whatever the clock's resolution
        os.utime(trace, (1_700_000_000 - age * 60, 1_700_000_000 - age * 60))
    return logdir


@pytest.fixture
def logdir(tensorboard_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "log"
    shutil.copytree(tensorboard_dir, copy)  # copytree keeps the times
    return copy


def _newest(directory: Path) -> Path:
    return next(directory.rglob("worker2.*.pt.trace.json.gz"))


def test_the_newest_trace_is_analysed_next_to_it(gd: Gpudoctor, logdir: Path) -> None:
    newest = _newest(logdir)
    result = gd.run("analyze", str(logdir))
    assert result.returncode == 0, result
    assert result.first_message == (f"gpudoctor: {logdir} holds 3 profiler traces; analysing the newest, "
                                    f"{newest.name} (use analyze PATH-TO-TRACE for another).")
    findings = checked_findings(logdir / "findings.json")
    assert findings["run"]["trace_only"] is True and findings["run"]["script"] == newest.name
    assert findings["run"]["steps_analysed"] == 2
    assert (logdir / "report.html").is_file()


def test_the_outputs_go_to_out(gd: Gpudoctor, logdir: Path) -> None:
    result = gd.run("analyze", str(logdir), "--out", "report")
    assert result.returncode == 0, result
    assert (gd.cwd / "report" / "findings.json").is_file() and (gd.cwd / "report" / "report.html").is_file()
    assert not (logdir / "findings.json").exists()


def test_tensorboard_plugin_layout(gd: Gpudoctor, logdir: Path) -> None:
    run = logdir / "plugins" / "profile" / "run1"
    run.mkdir(parents=True)
    trace = next(logdir.glob("worker0.*"))
    shutil.move(trace, run / trace.name)
    for other in logdir.glob("worker*"):
        other.unlink()
    result = gd.run("analyze", str(logdir))
    assert result.returncode == 0, result
    assert result.first_message == (f"gpudoctor: {logdir} holds one profiler trace; analysing it, "
                                    f"plugins/profile/run1/{trace.name}.")
    assert (run / "findings.json").is_file()


@pytest.mark.parametrize("contents", [(), ("notes.txt", "trace.json.gz")])
def test_a_directory_with_neither_a_manifest_nor_traces(gd: Gpudoctor, tmp_path: Path, contents: tuple) -> None:
    directory = tmp_path / "somewhere"
    directory.mkdir()
    for name in contents:
        (directory / name).write_text("")
    result = gd.run("analyze", str(directory))
    assert result.returncode == 65, result
    assert result.messages == [(
        f"gpudoctor: {directory} is neither a gpudoctor run directory (it has no manifest.json) nor a TensorBoard "
        "profiler directory (it holds no *.pt.trace.json traces).")]
