"""Gradient accumulation under DDP (gloo, CPU): --micro-steps batches per optimizer step.

Without --no-sync every micro-batch's backward all-reduces the gradients, though only the last one's are
used; with --no-sync (the fixed twin) the first micro-batches run under `model.no_sync()` and the gradients
are all-reduced once per optimizer step. The model is wide and the batches small, so the all-reduce of its
12 MB of gradients costs more than the compute it could overlap.
"""

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--micro-steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-sync", action="store_true", help="all-reduce once per optimizer step")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    width = args.width
    model = DistributedDataParallel(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                                                  nn.ReLU(), nn.Linear(width, width)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    for _ in range(args.steps):
        for micro in range(args.micro_steps):
            last = micro == args.micro_steps - 1
            skip_sync = model.no_sync() if args.no_sync and not last else contextlib.nullcontext()
            with skip_sync:
                loss = model(torch.randn(args.batch_size, width)).square().mean()
                loss.backward()  # all-reduces the gradients, unless under no_sync()
        optimizer.step()
        optimizer.zero_grad()
    per_step = (time.perf_counter() - started) / args.steps
    print(f"ddp_accumulate: rank {dist.get_rank()} {per_step * 1e3:.1f} ms per optimizer step")
    del model  # it holds the group: destroy_process_group() now ends it, and gloo's threads (spawn_ddp.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
