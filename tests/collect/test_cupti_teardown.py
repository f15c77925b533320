"""A window asks Kineto to detach CUPTI when it stops, so that the job's later steps run as they did before it."""

from __future__ import annotations

import os

import pytest
import torch

from gpudoctor.collect import cupti


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    return os.environ  # type: ignore[return-value]


@pytest.mark.parametrize("cuda", ["12.6", "12.8", "13.0"])
def test_cuda_builds_that_tear_down_safely_get_teardown(environ, monkeypatch, cuda: str) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    cupti.request_teardown()
    assert environ.get("TEARDOWN_CUPTI") == "1"


@pytest.mark.parametrize("cuda", ["11.8", "12.4", None])
def test_older_cuda_builds_and_cpu_builds_keep_kineto_default(environ, monkeypatch, cuda: str | None) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    cupti.request_teardown()
    assert "TEARDOWN_CUPTI" not in environ


def test_the_users_own_choice_is_kept(environ, monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    cupti.request_teardown()
    assert environ["TEARDOWN_CUPTI"] == "0"


@pytest.mark.parametrize("before", [None, "1", "0"])
def test_the_last_window_asks_for_no_teardown_and_puts_the_setting_back(environ, monkeypatch, before) -> None:
    if before is not None:
        monkeypatch.setenv("TEARDOWN_CUPTI", before)
    with cupti.no_teardown():
        assert environ["TEARDOWN_CUPTI"] == "0"
    assert environ.get("TEARDOWN_CUPTI") == before


class FakeProcess:
    """The process's native threads, and Kineto's detaching thread that ends at the first CUDA call after it
    has armed its callback (`arms_after` calls)."""

    def __init__(self, arms_after: int) -> None:
        self.tasks = {1, 2}
        self.arms_after = arms_after
        self.calls = 0

    def stop(self) -> None:
        self.tasks.add(99)

    def poke(self) -> bool:
        self.calls += 1
        if self.calls > self.arms_after:
            self.tasks.discard(99)
        return True


@pytest.fixture
def process(monkeypatch) -> FakeProcess:
    fake = FakeProcess(arms_after=3)
    monkeypatch.setattr(cupti, "_tasks", lambda: set(fake.tasks))
    monkeypatch.setattr(cupti, "_poke_cuda", fake.poke)
    monkeypatch.setattr(cupti, "POKE_INTERVAL_S", 0.0)
    return fake


def test_the_thread_a_stop_starts_is_seen_through_to_its_end(process) -> None:
    detach = cupti.Detach()
    with detach.watching():
        process.stop()
    assert detach.pending
    assert detach.complete(deadline_s=5)
    assert not detach.pending and process.calls == 4


def test_waiting_for_the_detach_is_bounded(process) -> None:
    process.arms_after = 10**9
    detach = cupti.Detach()
    with detach.watching():
        process.stop()
    assert not detach.complete(deadline_s=0.05)
    assert detach.pending


def test_threads_that_were_there_before_the_stop_are_not_waited_for(process) -> None:
    detach = cupti.Detach()
    with detach.watching():
        pass
    assert not detach.pending and detach.complete() and process.calls == 0
