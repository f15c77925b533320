"""Data-parallel training (gloo, CPU) where one rank loads its batches in the main process: the straggler.

Each sample takes --sample-ms to load (a sleep: reading from a slow disk). The ranks in --slow-ranks iterate
their DataLoader with num_workers=0, so every step waits for a whole batch; the other ranks have two workers
(--workers) that load ahead, and then wait for the slow rank in every all-reduce. `--slow-ranks ""` is the fixed
twin: every rank has its workers. With `--workers-off-after`, the slow ranks build their DataLoader with the
workers and turn them off on the line after (`loader.num_workers = 0`), where a fix made in DataLoader(...) does
not reach.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class SlowDisk(Dataset):
    def __init__(self, size: int, sample_ms: float) -> None:
        self.size, self.sample_s = size, sample_ms / 1e3

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.sample_s)
        return torch.randn(64), index % 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sample-ms", type=float, default=0.5)
    parser.add_argument("--width", type=int, default=512, help="the model's hidden width: its compute per step")
    parser.add_argument("--slow-ranks", default="1", help="comma-separated ranks that load without workers")
    parser.add_argument("--workers", type=int, default=2, help="the DataLoader workers of the other ranks")
    parser.add_argument("--workers-off-after", action="store_true",
                        help="the slow ranks set num_workers=0 after building their DataLoader with the workers")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = rank in {int(r) for r in args.slow_ranks.split(",") if r}
    off_after = slow and args.workers_off_after
    loader = DataLoader(SlowDisk(args.steps * args.batch_size, args.sample_ms), batch_size=args.batch_size,
                        num_workers=0 if slow and not off_after else args.workers)
    if off_after:
        loader.num_workers = 0
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, args.width), nn.ReLU(),
                                                  nn.Linear(args.width, args.width), nn.ReLU(),
                                                  nn.Linear(args.width, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started, timed = 0.0, 0
    for step, (inputs, targets) in enumerate(loader):
        if step == 2:  # the steps after the workers' start-up are timed
            started = time.perf_counter()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # the gradients' all-reduce: the fast ranks wait here for the slow one
        optimizer.step()
        timed = step - 1
    per_step = (time.perf_counter() - started) / max(1, timed)
    print(f"ddp_loader_straggler: rank {rank} ({'slow' if slow else 'fast'}) {per_step * 1e3:.1f} ms per step")
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
