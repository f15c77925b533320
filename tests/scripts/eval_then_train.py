"""Evaluates first, then trains: nanoGPT's shape (estimate_loss before the first step), and a sanity check's.

Options: --eval-calls N (no-grad forward calls of the model before training, quick), --steps M (optimizer steps,
each sleeping --sleep-ms, so that a training step is told from an evaluation call by its time).
"""

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-calls", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(4, 8), torch.randint(0, 2, (4,))
    model.eval()
    with torch.no_grad():
        for _ in range(args.eval_calls):
            model(inputs)
    model.train()
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.sleep_ms / 1000)
    print(f"eval_then_train: {args.eval_calls} evaluation calls, {args.steps} steps")


if __name__ == "__main__":
    main()
