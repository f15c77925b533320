"""GD101 on the CPU: a DataLoader with per-sample work; `--workers N` picks num_workers.

Each sample sleeps --sample-ms (standing for decoding: 40 ms a batch of 8); each step sleeps --compute-ms
after the optimizer (standing for GPU compute, 30 ms). With --workers 0 the step waits for every batch; with
2 workers, each making a batch in 40 ms, the loader keeps up with a step of 30 ms.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowData(Dataset):
    def __init__(self, size: int, sample_s: float) -> None:
        self.size, self.sample_s = size, sample_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.sample_s)
        return torch.full((8,), float(index)), index % 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=5.0)
    parser.add_argument("--compute-ms", type=float, default=30.0)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = SlowData(args.steps * args.batch_size, args.sample_ms / 1000)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers)  # LOADER
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.compute_ms / 1000)  # stands for the GPU's compute
    print("loader_main_process: done")


if __name__ == "__main__":
    main()
