"""Data-parallel training on the CPU with the gloo backend in which rank 1 fails: a bad batch after 3 steps."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-after", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == 1 and step == args.fail_after:
            # The other ranks are left waiting in their next all-reduce, until torchrun stops them.
            raise ValueError(f"rank 1 read a corrupt batch at step {step}")
        inputs, targets = torch.randn(16, 32), torch.randint(0, 4, (16,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
