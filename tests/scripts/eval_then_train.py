"""Evaluates first, then trains: nanoGPT's shape (estimate_loss before the first step), and a sanity check's.

Options: --eval-calls N (no-grad forward calls of the model before training, quick), --steps M (optimizer steps,
each sleeping --sleep-ms, so that a training step is told from an evaluation call by its time), --eval-every K
(after every K-th training step, an evaluation of 40 calls that sleep 5 ms each, as nanoGPT's estimate_loss),
--stall-at K (training step K also sleeps --stall-s seconds, 1 by default, as a checkpoint's write would take).
"""

import argparse
import time

import torch
from torch import nn


def evaluate(model: nn.Module, inputs: torch.Tensor, calls: int, sleep_s: float) -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(calls):
            model(inputs)
            time.sleep(sleep_s)
    model.train()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-calls", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--stall-at", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=1.0)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(4, 8), torch.randint(0, 2, (4,))
    evaluate(model, inputs, args.eval_calls, 0.0)
    for step in range(1, args.steps + 1):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.sleep_ms / 1000)
        if step == args.stall_at:
            time.sleep(args.stall_s)
        if args.eval_every and step % args.eval_every == 0:
            evaluate(model, inputs, 40, 0.005)
    print(f"eval_then_train: {args.eval_calls} evaluation calls, {args.steps} steps")


if __name__ == "__main__":
    main()
