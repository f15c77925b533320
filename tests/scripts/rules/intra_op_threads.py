"""GD505 on the CPU: a model of two 1024-wide layers trained on batches of 64 with torch's intra-op pool of
--threads threads; the test runs it while two other programs spin on the same two cores (the pathology: measured
plainly, 242 ms a step with 2 threads, 13 ms with 1) and with one thread (the fixed twin)."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(64, 1024)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("intra_op_threads: done")


if __name__ == "__main__":
    main()
