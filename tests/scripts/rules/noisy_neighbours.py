"""GD504 on the CPU: a training loop whose loader workers do CPU work, run while other programs spin on the host.

Two workers each spend 80 ms of CPU on a batch of 8; a step takes about 20 ms, so the workers keep both
cores busy on their own: run alone (the healthy twin), the host is busy too, but with the job's own processes.
The test starts the other programs (neighbours.py) itself, before this script, so they are never in its tree.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class BusyData(Dataset):
    def __init__(self, size: int, sample_s: float) -> None:
        self.size, self.sample_s = size, sample_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        end = time.perf_counter() + self.sample_s
        while time.perf_counter() < end:  # decoding, on the CPU
            pass
        return torch.full((8,), float(index)), index % 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = BusyData(args.steps * args.batch_size, args.sample_ms / 1000)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers)
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.compute_ms / 1000)  # stands for the GPU's compute
    print("noisy_neighbours: done")


if __name__ == "__main__":
    main()
