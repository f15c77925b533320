"""GD502's CPU-visible half: a training script that forks after it has put its model on the device.

On a GPU machine the model lands on CUDA before the fork, the pathology GD502 names; on a CPU-only machine
CUDA is never initialized, so the same forks are recorded but are harmless. It forks twice: a
multiprocessing pool with the fork start method, and DataLoader workers (fork is Linux's default).
"""

import multiprocessing

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def square(x: int) -> int:
    return x * x


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with multiprocessing.get_context("fork").Pool(2) as pool:  # POOL
        squares = pool.map(square, range(8))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, num_workers=2)
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs.to(device)), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"fork_workers: {sum(squares)}")


if __name__ == "__main__":
    main()
