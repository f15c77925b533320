"""GD312's CPU-visible case: many small tensors stepped by Adam's per-tensor loop (`--impl loop`, the
`foreach=False` the script builds), against the same model stepped by Adam's foreach or fused implementation.

On a CPU, torch.optim's default is the loop too (foreach is its default only for CUDA tensors), and the fused
kernel exists for CPU tensors (torch 2.4 and later): the loop's Python costs each of the 96 tensors a dozen
calls per step, the fused kernel one call for all of them.
"""

import argparse

import torch
from torch import nn

BLOCKS, WIDTH, BATCH = 24, 8, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=("loop", "foreach", "fused"), default="loop")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[nn.Module] = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH)]
    model = nn.Sequential(*layers)
    options = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.impl]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **options)  # OPTIMIZER
    inputs = torch.randn(BATCH, WIDTH)
    for _ in range(args.steps):
        loss = model(inputs).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"slow_optimizer: {loss.item():.4f}")


if __name__ == "__main__":
    main()
