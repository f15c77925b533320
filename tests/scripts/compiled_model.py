"""A compiled model that is evaluated under no_grad before it trains, as nanoGPT does; its forward converts dtypes,
which gpudoctor's copy hooks see in the detail steps. torch.compile's backend counts the graphs it is given and runs
them as they are (no C++ toolchain needed). Prints "compiled_model: done, N compiles" at the end."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(x.to(torch.float32)))
        return nn.functional.cross_entropy(self.second(hidden).float(), y)


COMPILES = []


def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    COMPILES.append(graph)
    return graph.forward


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    total = 0.0
    with torch.no_grad():
        for _ in range(12):
            total += model(x, y).item()
    return total / 12


def main() -> None:
    model = torch.compile(Net(), backend=counting_backend)
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    evaluation = evaluate(model, x, y)
    for _ in range(12):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"compiled_model: done, {len(COMPILES)} compiles; evaluation loss {evaluation:.3f}, last {loss.item():.3f}")


if __name__ == "__main__":
    main()
