"""A small CUDA loop for the GPU suite: training or inference, over a DataLoader, ending as asked.

It prints only `suite:` lines whose text does not depend on timing, so that a plain run and a profiled one print
the same. --end: ok | raise | sigterm (the process kills itself) | forever (loops until stopped) | oom (asks for more
memory than the GPU holds).
"""

import argparse
import contextlib
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """Random images, the same ones in every run; each takes `sample_ms` to read (a sleep)."""

    def __init__(self, length: int, sample_ms: float) -> None:
        self.length = length
        self.sample_s = sample_ms / 1e3

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.sample_s:
            time.sleep(self.sample_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=generator), index % 10


def network() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def batches(loader: DataLoader, steps: int, forever: bool):
    done = 0
    while forever or done < steps:
        for batch in loader:
            yield batch
            done += 1
            if not forever and done == steps:
                return


class Trainer:
    def __init__(self, net: nn.Module, bf16: bool, graphs: bool) -> None:
        self.net = net
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        self.precision = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        self.graph: torch.cuda.CUDAGraph | None = None
        if graphs:
            self._capture()

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.precision:
            return nn.functional.cross_entropy(self.net(x), y)

    def _capture(self) -> None:
        """The whole step as one CUDA graph, as torch.cuda.graphs' documentation captures it."""
        self.static_x = torch.zeros(64, 3, 32, 32, device="cuda")
        self.static_y = torch.zeros(64, dtype=torch.long, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.optimizer.zero_grad(set_to_none=True)
                self._loss(self.static_x, self.static_y).backward()
                self.optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self._loss(self.static_x, self.static_y).backward()
            self.optimizer.step()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.graph is not None:
            self.static_x.copy_(x)
            self.static_y.copy_(y)
            self.graph.replay()
            return
        self.optimizer.zero_grad()
        self._loss(x, y).backward()
        self.optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("train", "inference_mode", "no_grad"), default="train")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--sample-ms", type=float, default=0.0)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--end", choices=("ok", "raise", "sigterm", "forever", "oom"), default="ok")
    args = parser.parse_args()
    torch.manual_seed(0)
    net = network().cuda()
    if args.compile:
        net = torch.compile(net)
    loader = DataLoader(Images(64 * args.steps, args.sample_ms), batch_size=64, num_workers=args.workers,
                        pin_memory=args.pin, drop_last=True)
    trainer = Trainer(net, args.bf16, args.graphs) if args.mode == "train" else None
    grad = torch.inference_mode() if args.mode == "inference_mode" else torch.no_grad()
    for images, labels in batches(loader, args.steps, args.end == "forever"):
        x, y = images.cuda(non_blocking=args.pin), labels.cuda(non_blocking=args.pin)
        if trainer is not None:
            trainer.step(x, y)
        else:
            with grad:
                net(x)
    torch.cuda.synchronize()
    print(f"suite: {args.mode} loop of {args.steps} steps done", flush=True)
    if args.end == "raise":
        raise RuntimeError("the loop failed on purpose")
    if args.end == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if args.end == "oom":
        total = torch.cuda.mem_get_info()[1]
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # twice what the device holds


if __name__ == "__main__":
    main()
