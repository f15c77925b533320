"""GD314's CPU-visible case: a compiled model (`--backend`, eager by default, which compiles quickly on a CPU) with a
`.item()` in its forward, which breaks its graph, fed sequences whose length changes, which recompile it (`--fixed`:
the twin, one length and no read in the forward)."""

import argparse

import torch
from torch import nn

LENGTHS = (8, 12, 16, 20)


class Tagger(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.embed = nn.Embedding(100, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if not self.fixed and x.abs().max().item() > 1e4:  # BREAK
            x = x.clamp(-1e4, 1e4)
        return self.out(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--fixed", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Tagger(args.fixed)
    net = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    lengths = (max(LENGTHS),) if args.fixed else LENGTHS
    for step in range(args.steps):
        tokens = torch.randint(0, 100, (4, lengths[step % len(lengths)]))
        loss = net(tokens).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"recompiles: {loss.item():.4f}")


if __name__ == "__main__":
    main()
