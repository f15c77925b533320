"""The window's copy and sync hooks name the line of the script that made the call, and never raise into it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.instrument import Instrumentation
from gpudoctor.collect.recorder import Recorder


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The detail steps' hooks, installed in this process; torch.cuda made to look available, its synchronize a
    no-op, so that the sync hook is installed on a machine without a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    recorder = Recorder(ChildConfig(run_dir=str(tmp_path)))
    instrumentation = Instrumentation(recorder)
    instrumentation._install_window_hooks()
    yield recorder
    instrumentation._in_window.restore()
    recorder.close_window()


def _line_here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_a_copy_names_the_line_that_made_it(hooked: Recorder) -> None:
    torch.ones(4).to("meta"); line = _line_here()  # noqa: E702 - the copy and its line number on one line
    [key] = hooked.current.copies
    direction, _, _, file, copied_at, function = key
    assert (direction, Path(file).name, copied_at, function) == ("h2d", "test_hook_sites.py", line,
                                                                 "test_a_copy_names_the_line_that_made_it")


def test_a_sync_names_the_line_that_made_it(hooked: Recorder) -> None:
    torch.cuda.synchronize(); line = _line_here()  # noqa: E702
    [key] = hooked.current.syncs
    kind, via, file, synced_at, _ = key
    assert (kind, via, Path(file).name, synced_at) == ("synchronize", None, "test_hook_sites.py", line)


def test_a_failing_measurement_leaves_the_call_alone(hooked: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the recorder is broken")

    monkeypatch.setattr(hooked, "add_copy", broken)
    monkeypatch.setattr(hooked, "add_sync", broken)
    assert torch.ones(4).to("meta").shape == (4,)
    torch.cuda.synchronize()


def test_an_optimizer_step_leaves_out_what_its_closure_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """optimizer.step(closure) (Lightning's, LBFGS's) runs the forward and backward inside it: they are timed as
    theirs, and the optimizer's own time leaves them out."""
    import time

    recorder = Recorder(ChildConfig(run_dir=str(tmp_path)))
    instrumentation = Instrumentation(recorder)
    instrumentation._hook_optimizers()
    timed: list[float] = []
    monkeypatch.setattr(recorder, "on_optimizer_step", lambda optimizer, seconds: timed.append(seconds))
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def closure() -> torch.Tensor:
        started = time.perf_counter()
        time.sleep(0.05)  # the forward and backward, as their hooks time them
        recorder.add_phase("forward", time.perf_counter() - started)
        loss = (weight * 2).sum()
        loss.backward()
        return loss

    try:
        optimizer.step(closure)
    finally:
        for handle in instrumentation._optimizer_hooks:
            handle.remove()
    assert len(timed) == 1 and timed[0] < 0.03, timed
