"""GD702's CPU-visible cases: a short job whose start-up dominates it. `--setup-s S`: the script indexes its dataset
for S seconds before its first step (the twin: 0, an index read from a cache); `--workers N`: a DataLoader of N
workers without persistent_workers, in epochs of `--epoch-steps` steps, starts its workers again at every epoch
(the twin: `--persistent`); `--worker-start-cpu-s S`: each worker computes S seconds before its first sample (as
one that imports a heavy library does), so that many more workers than cores start in turn."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((16,), float(index % 7)), index % 2


def spin(seconds: float) -> None:
    until = time.thread_time() + seconds  # CPU time, whatever the other workers take of the cores
    while time.thread_time() < until:
        pass


def index_dataset(seconds: float) -> int:
    time.sleep(seconds)  # INDEXING
    return 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup-s", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epoch-steps", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worker-start-cpu-s", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    batch = index_dataset(args.setup_s)
    model = nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(batch * args.epoch_steps), batch_size=batch, num_workers=args.workers,  # LOADER
                        persistent_workers=args.persistent and args.workers > 0,
                        worker_init_fn=(lambda _: spin(args.worker_start_cpu_s)) if args.worker_start_cpu_s else None)
    done = 0
    while done < args.steps:
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == args.steps:
                break
    print(f"slow_startup: {loss.item():.4f}")


if __name__ == "__main__":
    main()
