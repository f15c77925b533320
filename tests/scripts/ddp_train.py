"""Data-parallel training on the CPU with the gloo backend, as torchrun starts it: one process per rank.

--evaluate-on-rank0 N: rank 0 alone first calls the model N times under no_grad, as nanoGPT's master process
evaluates before training while the other ranks wait for it in their first all-reduce.
"""

import argparse

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--evaluate-on-rank0", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        with torch.no_grad():
            for _ in range(args.evaluate_on_rank0):
                model(torch.randn(16, 32))
    for _ in range(args.steps):
        inputs, targets = torch.randn(16, 32), torch.randint(0, 4, (16,))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # the gradients' all-reduce runs here, over gloo
        optimizer.step()
    print(f"ddp_train: rank {rank} of {dist.get_world_size()} did {args.steps} steps")
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
