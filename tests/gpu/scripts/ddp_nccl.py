"""Data-parallel training over NCCL, one process per GPU: as torchrun starts it (RANK, LOCAL_RANK, WORLD_SIZE),
or from mp.spawn with --spawn N."""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank: int, world: int, steps: int) -> None:
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64 * steps * world, 256), torch.randint(0, 10, (64 * steps * world,)))
    loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data), num_workers=2, pin_memory=True)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    if rank == 0:
        print(f"suite: ddp of {world} ranks did {len(loader)} steps", flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing")
    args = parser.parse_args()
    if args.spawn:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        mp.spawn(train, args=(args.spawn, args.steps), nprocs=args.spawn)
        print("suite: spawn ended", flush=True)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps)


if __name__ == "__main__":
    main()
