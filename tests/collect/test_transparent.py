"""gpudoctor's wrappers are indistinguishable from the torch and stdlib APIs they wrap, to a library that introspects
them, and nothing is added to the script's objects."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.instrument import Instrumentation
from gpudoctor.collect.recorder import Recorder


@pytest.fixture
def instrumented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Instrumentation]:
    """Every patch gpudoctor makes, in place in this process: the always-on ones and the detail steps' (with
    torch.cuda made to look available, so that the sync hooks on torch.cuda are made too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    recorder = Recorder(ChildConfig(run_dir=str(tmp_path)))
    instrumentation = Instrumentation(recorder)
    instrumentation._patch_threads()
    instrumentation._patch_processes()
    instrumentation.on_torch_imported()
    instrumentation._install_window_hooks()
    yield instrumentation
    instrumentation._in_window.restore()
    instrumentation.uninstall()
    recorder.close_window()


def _patched(instrumentation: Instrumentation) -> list[tuple[Any, str, Any]]:
    return instrumentation._always.patched() + instrumentation._in_window.patched()


def _signature(function: Any) -> str:
    """The signature as inspect gives it, or the error inspect raises for it (a C method has none)."""
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_every_patch_is_made(instrumented: Instrumentation) -> None:
    names = {f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in _patched(instrumented)}
    assert {"DataLoader.__init__", "DataLoader.__iter__", "_BaseDataLoaderIter.__next__", "Thread.start",
            "BaseProcess.start", "torch.autograd.backward", "Tensor.to", "Tensor.copy_", "Tensor.item",
            "torch.cuda.synchronize"} <= names


def test_every_patched_callable_keeps_its_signature_and_names(instrumented: Instrumentation) -> None:
    for owner, name, original in _patched(instrumented):
        wrapper = getattr(owner, name)
        assert wrapper is not original, f"{owner}.{name} is not patched"
        for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
            assert getattr(wrapper, attribute, None) == getattr(original, attribute, None), (
                f"{owner}.{name}: {attribute} differs")
        assert _signature(wrapper) == _signature(original), f"{owner}.{name}: the signature differs"
        assert inspect.unwrap(wrapper) is inspect.unwrap(original)


def test_a_library_finds_the_dataloaders_parameters(instrumented: Instrumentation) -> None:
    """Lightning rebuilds a DataLoader from the parameters of DataLoader.__init__ (its first positional one is
    `dataset`)."""
    parameters = list(inspect.signature(DataLoader.__init__).parameters)
    assert parameters[:3] == ["self", "dataset", "batch_size"]


def test_a_dataloader_gets_no_attribute(instrumented: Instrumentation) -> None:
    dataset = TensorDataset(torch.arange(8.0))
    plain_attributes = set(vars(_unpatched_loader(instrumented, dataset)))
    loader = DataLoader(dataset, batch_size=4)
    assert [batch[0].tolist() for batch in loader] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert set(vars(loader)) == plain_attributes


def test_what_gpudoctor_learns_of_a_loader_goes_with_it(instrumented: Instrumentation) -> None:
    loader = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)
    list(loader)
    assert len(instrumented.loaders.sites) == 1 and len(instrumented.loaders.numbers) == 1
    del loader
    assert len(instrumented.loaders.sites) == 0 and len(instrumented.loaders.numbers) == 0


def _unpatched_loader(instrumentation: Instrumentation, dataset: TensorDataset) -> DataLoader:
    """A DataLoader made by the original __init__, beside the patched one."""
    [original] = [o for owner, name, o in _patched(instrumentation) if owner is DataLoader and name == "__init__"]
    loader = DataLoader.__new__(DataLoader)
    original(loader, dataset, batch_size=4)
    return loader
