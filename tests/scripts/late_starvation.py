"""A job whose input pipeline turns slow part-way through, as when it reaches a shard on slow storage.

The DataLoader loads in the main process. Its samples cost nothing for the first --fast-steps steps, then
5 ms each (40 ms a batch of 8, against a step of 30 ms): from then on the step waits for its data.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class ShardedData(Dataset):
    def __init__(self, size: int, fast_samples: int, slow_sample_s: float) -> None:
        self.size, self.fast_samples, self.slow_sample_s = size, fast_samples, slow_sample_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if index >= self.fast_samples:
            time.sleep(self.slow_sample_s)  # the slow shard
        return torch.full((8,), float(index)), index % 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--fast-steps", type=int, default=40)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ShardedData(args.steps * 8, args.fast_steps * 8, 0.005), batch_size=8)  # LOADER
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.03)  # stands for the GPU's compute
    print("late_starvation: done")


if __name__ == "__main__":
    main()
