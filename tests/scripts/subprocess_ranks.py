"""DDP over --nproc ranks that the script starts itself as plain subprocesses (`python subprocess_ranks.py --rank
K` with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set), as a hand-written launcher does; gloo on the CPU."""

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from torch.nn.parallel import DistributedDataParallel


def train(steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(64, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    sys.stdout.write(f"subprocess_ranks: rank {rank} of {world_size} did {steps} steps\n")
    sys.stdout.flush()
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


def launch(nproc: int, steps: int) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, __file__, "--steps", str(steps), "--worker"],
                              env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for rank in range(nproc)]
    return max(process.wait() for process in ranks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--worker", action="store_true", help="run as one rank (the launcher sets RANK)")
    args = parser.parse_args()
    if args.worker:
        train(args.steps)
    else:
        sys.exit(launch(args.nproc, args.steps))
