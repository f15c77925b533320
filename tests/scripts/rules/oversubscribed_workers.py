"""GD503 on the CPU: DataLoader workers that each run a pool of intra-op threads for per-sample torch work.

`--worker-threads N` is what each worker's worker_init_fn passes to torch.set_num_threads: 8 on a small
host oversubscribes its cores; 1, the healthy twin, gives each worker one compute thread.
"""

import argparse
import functools

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class MatmulData(Dataset):
    def __init__(self, size: int, matmuls: int) -> None:
        self.size, self.matmuls = size, matmuls

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        x = torch.randn(256, 256)
        for _ in range(self.matmuls):  # per-sample CPU work in torch: uses the worker's intra-op threads
            x = torch.tanh(x @ x)
        return x[0, :8], index % 2


def set_threads(count: int, worker_id: int) -> None:
    torch.set_num_threads(count)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-threads", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--matmuls", type=int, default=24)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = MatmulData(args.steps * args.batch_size, args.matmuls)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers,  # LOADER
                        worker_init_fn=functools.partial(set_threads, args.worker_threads))
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("oversubscribed_workers: done")


if __name__ == "__main__":
    main()
