"""DDP over --nproc processes that the script starts with torch.multiprocessing.spawn, as pytorch/examples' ImageNet
does with --multiprocessing-distributed (gloo on the CPU).

Each rank ends its process group, and gloo's threads with it, before the interpreter shuts down. A gloo worker
thread can be the last to hold a finished all-reduce, whose saved thread-local state holds Python objects; freeing
it once shutdown has begun, the thread cannot take the GIL and its exit aborts the process ("terminate called
without an active exception"; 1 plain run in 120 of this script here, 1 in 10 on a loaded CI machine).
destroy_process_group() ends the group, joining its threads with the GIL released, only once nothing else holds it:
DDP does, until the model is deleted, and so would torch.distributed.nn, which DDP imports, had it been imported
after init_process_group(): its functions take `group=group.WORLD` as a default, the group of the moment. The other
test scripts with DDP do the same.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists: see above
import torch.multiprocessing as mp
from group_at_exit import say_group_at_shutdown
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def say(line: str) -> None:
    """One write for the whole line: ranks share stdout, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(rank: int, world_size: int, steps: int, crash_rank: int | None = None, say_group: bool = False) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if say_group:
        say_group_at_shutdown(rank)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, world_size, rank))
    done = 0
    while done < steps:  # epochs, until `steps` steps
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if rank == crash_rank and done == 4:
                raise RuntimeError(f"rank {rank} crashed on purpose")
            if done == steps:
                break
    say(f"spawn_ddp: rank {rank} of {world_size} did {done} steps")
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (see above)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--crash-rank", type=int, default=None, help="this rank raises at its 4th step")
    parser.add_argument("--say-group-at-shutdown", action="store_true", help="group_at_exit.py")
    args = parser.parse_args()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
    mp.spawn(train, args=(args.nproc, args.steps, args.crash_rank, args.say_group_at_shutdown), nprocs=args.nproc)
