"""A realistic GPU training loop for the overhead benchmark: a small ResNet on synthetic images.

Prints one JSON line: steps, wall time, and the throughput of the steps after the profiling window
(steps 20 onwards), so the benchmark can compare the job outside the window too.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def block(channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
                         nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))


class SmallResNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList(block(width) for _ in range(blocks))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    images = torch.randn(2048, 3, 32, 32)
    labels = torch.randint(0, 10, (2048,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=2, pin_memory=device == "cuda", persistent_workers=True)
    model = SmallResNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    started = time.perf_counter()
    step, after_window_start = 0, None
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 20:
                if device == "cuda":
                    torch.cuda.synchronize()
                after_window_start = time.perf_counter()
            if step >= args.steps:
                break
    if device == "cuda":
        torch.cuda.synchronize()
    ended = time.perf_counter()
    rate = (step - 20) / (ended - after_window_start) if after_window_start else None
    print(json.dumps({"steps": step, "wall_s": ended - started, "steps_per_s_after_window": rate}))


if __name__ == "__main__":
    main()
