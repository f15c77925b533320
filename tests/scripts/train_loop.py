"""A small training loop whose Dataset sleeps a known time per sample, so every batch's data wait is known.

Options: --steps N (optimizer steps), --batch-size B, --sleep-ms S (per sample),
--mode train|infer|explicit|sgd|forward, --report PATH (writes {"steps": N, "saved_hooks": H, "inductor_imported": I}
when done: H is how many hooks a torch.save of the whole model, as many scripts do at the end, carried; I whether
torch._inductor was imported by the end of the loop, which the script never does itself), --after-s S (seconds of work
after the loop, as an evaluation would take). `infer`
iterates the DataLoader with no optimizer; `explicit` uses neither and marks steps with gpudoctor.step(); `sgd`
updates the weights by hand after backward(), with no optimizer and no DataLoader; `forward` calls the model in a
loop, with neither.
"""

import argparse
import io
import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SleepyData(Dataset):
    def __init__(self, size: int, sleep_s: float) -> None:
        self.size, self.sleep_s = size, sleep_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.sleep_s)
        return torch.full((8,), float(index)), index % 2


def train(loader: DataLoader, model: nn.Module) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def infer(loader: DataLoader, model: nn.Module) -> int:
    batches = 0
    with torch.no_grad():
        for inputs, _ in loader:
            model(inputs)
            batches += 1
    return batches


def explicit(steps: int, model: nn.Module) -> int:
    import gpudoctor

    for _ in range(steps):
        with torch.no_grad():
            model(torch.randn(4, 8))
        time.sleep(0.002)
        gpudoctor.step()
    return steps


def sgd(steps: int, model: nn.Module) -> int:
    for _ in range(steps):
        inputs, labels = torch.randn(4, 8), torch.randint(0, 2, (4,))
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.01)
                p.grad = None
        time.sleep(0.002)
    return steps


def forward(steps: int, model: nn.Module) -> int:
    with torch.no_grad():
        for _ in range(steps):
            model(torch.randn(4, 8))
            time.sleep(0.002)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    parser.add_argument("--mode", choices=["train", "infer", "explicit", "sgd", "forward"], default="train")
    parser.add_argument("--report")
    parser.add_argument("--after-s", type=float, default=0.0)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    data = SleepyData(args.steps * args.batch_size, args.sleep_ms / 1000)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=0)
    if args.mode == "train":
        done = train(loader, model)
    elif args.mode == "infer":
        done = infer(loader, model)
    elif args.mode == "explicit":
        done = explicit(args.steps, model)
    else:
        done = {"sgd": sgd, "forward": forward}[args.mode](args.steps, model)
    time.sleep(args.after_s)
    inductor_imported = "torch._inductor" in sys.modules  # before torch.save, which imports it
    print(f"train_loop: {args.mode} did {done} steps")
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in loaded.modules())
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"steps": done, "saved_hooks": hooks, "inductor_imported": inductor_imported}, f)


if __name__ == "__main__":
    main()
