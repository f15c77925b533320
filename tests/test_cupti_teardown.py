"""A window asks Kineto to detach CUPTI when it stops, so that the job's later steps run as they did before it."""

from __future__ import annotations

import os

import pytest
import torch

from gpudoctor.collect.window import _detach_cupti_after_each_window


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    return os.environ  # type: ignore[return-value]


@pytest.mark.parametrize("cuda", ["12.6", "12.8", "13.0"])
def test_cuda_builds_that_tear_down_safely_get_teardown(environ, monkeypatch, cuda: str) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    _detach_cupti_after_each_window()
    assert environ.get("TEARDOWN_CUPTI") == "1"


@pytest.mark.parametrize("cuda", ["11.8", "12.4", None])
def test_older_cuda_builds_and_cpu_builds_keep_kineto_default(environ, monkeypatch, cuda: str | None) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    _detach_cupti_after_each_window()
    assert "TEARDOWN_CUPTI" not in environ


def test_the_users_own_choice_is_kept(environ, monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    _detach_cupti_after_each_window()
    assert environ["TEARDOWN_CUPTI"] == "0"
