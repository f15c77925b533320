"""Trains a small model in a process started by torch.multiprocessing.spawn, as a DDP script does; the main process
only waits for it."""

import argparse
import time

import torch
import torch.multiprocessing as mp
from torch import nn


def train(index: int, seconds: float) -> None:
    model = nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < deadline:
        loss = model(torch.randn(256, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    print(f"spawned_training: process {index} ran {steps} steps", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    mp.spawn(train, args=(parser.parse_args().seconds,), nprocs=1)
