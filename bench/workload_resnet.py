"""A realistic GPU training loop for the overhead benchmark: a small ResNet on synthetic images.

    python3 bench/workload_resnet.py --steps 200 --batch-size 128 [--small]

Prints one JSON line: steps, wall time, and the throughput of the steps after the profiling window
(steps 20 onwards), so the benchmark can compare the job outside the window too. --small shrinks the
model for a quick try on a CPU.
"""

import time

STARTED_AT = time.time()  # before torch's import: what runs before the script itself ends here

import argparse  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from workload_common import make_loader, pick_device, print_result, train  # noqa: E402

IMAGES = 2048


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


def synthetic_images() -> TensorDataset:
    return TensorDataset(torch.randn(IMAGES, 3, 32, 32), torch.randint(0, 10, (IMAGES,)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--small", action="store_true", help="a narrower, shallower model for a quick CPU try")
    args = parser.parse_args()
    device = pick_device()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    loader = make_loader(synthetic_images(), args.batch_size, device)
    model = SmallResNet(width=16, blocks=2) if args.small else SmallResNet()
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def train_step(batch: list[torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    print_result(train(loader, train_step, args.steps, device), STARTED_AT)


if __name__ == "__main__":
    main()
