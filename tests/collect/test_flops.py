"""One step's matrix work, counted in the script's process (collect.flops): each product, convolution and attention
by the dtype it runs in, forward and backward, and nothing counted where torch.compile compiled the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import Gpudoctor, script
from gpudoctor.bundle.events import FlopsEvent, StepEvent
from gpudoctor.collect.flops import COMPILED, NOT_LOADED, _counting_mode, kind_of


def test_operators_are_told_apart_by_kind() -> None:
    assert [kind_of(n) for n in ("aten.mm", "aten.addmm", "aten.bmm", "aten.convolution_backward",
                                 "aten._scaled_dot_product_efficient_attention")] == [
        "gemm", "gemm", "gemm", "conv", "attention"]


def test_a_step_under_autocast_is_counted_in_the_dtype_its_products_run_in() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    mode = _counting_mode()
    with mode, torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(4, 8)).float().sum().backward()
    # forward 2·4·(8·16 + 16·2) = 1280, the weights' gradients as many, the second layer's input gradient 2·4·16·2
    assert dict(mode.counts) == {("gemm", "bfloat16"): [2816, 5]}


@pytest.mark.e2e
def test_the_first_detail_step_is_counted_and_the_others_run_as_they_did(gd: Gpudoctor) -> None:
    result = gd.profile(script("train_loop.py"), "--steps", "12", "--batch-size", "4", "--sleep-ms", "0")
    assert result.returncode == 0, result
    [counted] = result.events(FlopsEvent)
    detail = [e.step for e in result.events(StepEvent) if e.window == "detail"]
    assert counted.step == detail[0] and counted.reason is None
    assert [(w.kind, w.dtype, w.flops, w.calls) for w in counted.work] == [("gemm", "float32", 2816, 5)]
    assert counted.tf32_matmul is False


@pytest.mark.e2e
def test_a_compiled_model_is_not_counted(gd: Gpudoctor) -> None:
    result = gd.profile(script("compiled_model.py"))
    assert result.returncode == 0, result
    assert [e.reason for e in result.events(FlopsEvent)] == [COMPILED]


@pytest.mark.e2e
def test_a_script_that_never_loads_torch_compile_is_not_counted_and_does_not_load_it(gd: Gpudoctor, tmp_path) -> None:
    """A dispatch mode imports torch._dynamo and inductor as it is entered: a loop with no torch.optim optimizer
    (backward and a hand-written update) has neither, and keeps it so under gpudoctor."""
    report = tmp_path / "report.json"
    result = gd.profile(script("train_loop.py"), "--steps", "12", "--mode", "sgd", "--sleep-ms", "0",
                        "--report", str(report))
    assert result.returncode == 0, result
    assert [e.reason for e in result.events(FlopsEvent)] == [NOT_LOADED]
    import json

    assert json.loads(report.read_text())["inductor_imported"] is False
