"""What the overhead benchmark's workloads share: the device, the DataLoader, the timed loop and its JSON line.

The loop is what a healthy job does: batches come from two pinned-memory workers, copies are non-blocking, and
the loss is summed on the device and read once at the end, so no step waits for the GPU. The only syncs are the
two that bound the timing: at step 20 (after gpudoctor's default window) and at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

AFTER_WINDOW_STEP = 20
LOADER_WORKERS = 2


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_loader(dataset: Dataset, batch_size: int, device: str) -> DataLoader:
    """Two pinned-memory workers, started now: call it before CUDA is initialized, so they fork without it."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=LOADER_WORKERS,
                        pin_memory=device == "cuda", persistent_workers=True)
    iter(loader)  # persistent workers: the training loop's first `for` reuses them
    return loader


def to_device(batch: Sequence[torch.Tensor], device: str) -> list[torch.Tensor]:
    return [tensor.to(device, non_blocking=True) for tensor in batch]


def wait_for_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(loader: DataLoader, train_step: Callable[[list[torch.Tensor]], torch.Tensor], steps: int,
          device: str) -> dict:
    """Runs `train_step` (which returns the detached loss) on `steps` batches; returns the benchmark's facts: the
    loop's wall time and its start on the wall clock, the time of its first AFTER_WINDOW_STEP steps (gpudoctor's
    window among them), and the steps per second after those."""
    loss_sum = torch.zeros((), device=device)
    started, started_at = time.perf_counter(), time.time()
    step, after_window_started = 0, None
    while step < steps:
        for batch in loader:
            loss_sum += train_step(to_device(batch, device))
            step += 1
            if step == AFTER_WINDOW_STEP:
                wait_for_device(device)
                after_window_started = time.perf_counter()
            if step >= steps:
                break
    wait_for_device(device)
    ended = time.perf_counter()
    rate = (step - AFTER_WINDOW_STEP) / (ended - after_window_started) if after_window_started else None
    head = after_window_started - started if after_window_started else None
    return {"steps": step, "wall_s": ended - started, "steps_per_s_after_window": rate, "head_s": head,
            "loop_started_at": started_at, "mean_loss": loss_sum.item() / max(step, 1)}


def print_result(result: dict, started_at: float) -> None:
    """The one JSON line the benchmark reads (the last stdout line that starts with `{`), with the script's first
    and last moments on the wall clock: what a wrapper adds before and after the script lies outside them."""
    print(json.dumps({**result, "started_at": started_at, "ended_at": time.time()}), flush=True)
