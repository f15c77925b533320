"""A training loop of short steps for bench/events_growth.py: a linear model on random inputs, an SGD step and a
sleep of --step-ms each step, for --seconds."""

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--step-ms", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = nn.Linear(64, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(16, 64)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        loss = model(inputs).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_ms / 1e3)


if __name__ == "__main__":
    main()
