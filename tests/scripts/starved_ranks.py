"""Two DDP ranks (gloo on the CPU), each starved by its DataLoader: a sample takes 4 ms to make (a sleep, as reading a
file would) and the loader makes them in the rank's own process. Each step's device work is a 20 ms sleep, as a
GPU's would be. Under torchrun (RANK set) this process is one rank; run plainly, it starts both with
torch.multiprocessing.spawn. `--workers 2` is the fixed twin."""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SlowSamples(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.004)
        return torch.full((32,), float(index % 7)), torch.tensor([float(index % 3)])


def train(rank: int, world_size: int, steps: int, workers: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = SlowSamples()
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, world_size, rank), num_workers=workers)
    done = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.020)
        done += 1
        if done == steps:
            break
    print(f"spawn_starved: rank {rank} did {done} steps", flush=True)
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    if "RANK" in os.environ:  # a rank of torchrun, which set the rendezvous
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps, args.workers)
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
        mp.spawn(train, args=(2, args.steps, args.workers), nprocs=2)
