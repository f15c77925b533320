"""GD701's CPU-visible case: a model and its Adam state written with torch.save every `--every` steps (`--every 0`:
once, after the loop, the twin). Each save of ~25 MB holds its step up tens of times a usual step."""

import argparse
import os
import tempfile

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs = torch.randn(4, 1024)
    folder = tempfile.mkdtemp(prefix="checkpoints-")
    path = os.path.join(folder, "last.pt")
    for step in range(args.steps):
        loss = model(inputs).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.every and step % args.every == args.every - 1:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)  # SAVE
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    print(f"checkpoint_stall: {loss.item():.4f}")


if __name__ == "__main__":
    main()
