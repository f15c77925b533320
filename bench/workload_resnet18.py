"""torchvision's ResNet-18 on synthetic 224×224 images: the overhead benchmark's 500-step training run.

    python3 bench/workload_resnet18.py --steps 500 --batch-size 128

Prints the same JSON line as the other workloads (workload_common). Needs torchvision.
"""

import time

STARTED_AT = time.time()  # before torch's import: what runs before the script itself ends here

import argparse  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402
from torchvision.models import resnet18  # noqa: E402

from workload_common import make_loader, pick_device, print_result, train  # noqa: E402

IMAGES = 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--small", action="store_true", help="64×64 images, for a quick try on a CPU")
    args = parser.parse_args()
    device = pick_device()
    torch.manual_seed(0)
    size = 64 if args.small else 224
    images = TensorDataset(torch.randn(IMAGES, 3, size, size), torch.randint(0, 10, (IMAGES,)))
    loader = make_loader(images, args.batch_size, device)
    model = resnet18(num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def train_step(batch: list[torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    print_result(train(loader, train_step, args.steps, device), STARTED_AT)


if __name__ == "__main__":
    main()
