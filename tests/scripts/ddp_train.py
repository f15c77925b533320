"""Data-parallel training on the CPU with the gloo backend, as torchrun starts it: one process per rank.

--evaluate-on-rank0 N: rank 0 alone first calls the model N times under no_grad, as nanoGPT's master process
evaluates before training while the other ranks wait for it in their first all-reduce. --slow-rank R --slow-s S:
rank R sleeps S seconds in each step (a straggler the others wait for). --init slurm (or ompi): the process group is
built from Slurm's task variables (SLURM_PROCID, SLURM_NTASKS), as a script launched by `srun` builds it (or from
Open MPI's, OMPI_COMM_WORLD_RANK and _SIZE, as one `mpirun` launches).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--evaluate-on-rank0", type=int, default=0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--init", choices=("env", "slurm", "ompi"), default="env")
    parser.add_argument("--say-group-at-shutdown", action="store_true", help="group_at_exit.py")
    args = parser.parse_args()
    if args.init in ("slurm", "ompi"):
        rank_of, size_of = {"slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
                            "ompi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")}[args.init]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ[rank_of]), world_size=int(os.environ[size_of]))
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.say_group_at_shutdown:
        # Imported only here: a test runs a copy of this file alone as a module of its working directory.
        from group_at_exit import say_group_at_shutdown

        say_group_at_shutdown(rank)
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        with torch.no_grad():
            for _ in range(args.evaluate_on_rank0):
                model(torch.randn(16, 32))
    for _ in range(args.steps):
        inputs, targets = torch.randn(16, 32), torch.randint(0, 4, (16,))
        if rank == args.slow_rank:
            time.sleep(args.slow_s)  # SLOW
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # the gradients' all-reduce runs here, over gloo
        optimizer.step()
    print(f"ddp_train: rank {rank} of {dist.get_world_size()} did {args.steps} steps")
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
