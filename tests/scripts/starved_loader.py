"""A training loop starved by its DataLoader: each sample takes 4 ms to make (a sleep, as reading a file would),
and the loader makes them in the training process (num_workers=0, the default). Each step's device work is a
20 ms sleep after a small model's step, as a GPU's would be on a machine that has none: on two shared cores the
timings then hold still. `--workers 2 --persistent` is its fixed twin. `--crash-with-workers` raises once the
loader has workers (a fix that breaks the script); `--checkpoint PATH` saves the model every 10 steps, as a
training script does.

Prints one JSON line: the mean time of the steps after the first WARMUP, as the script measures them itself.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = 0.004
DEVICE_S = 0.020
BATCH = 8
WARMUP = 6


class SlowSamples(Dataset):
    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SAMPLE_S)
        return torch.full((64,), float(index % 7)), torch.tensor(index % 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--crash-with-workers", action="store_true")
    parser.add_argument("--checkpoint")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowSamples(args.steps * BATCH), batch_size=BATCH, num_workers=args.workers,
                        persistent_workers=args.persistent)
    if args.crash_with_workers and loader.num_workers > 0:
        raise RuntimeError("this script does not run with DataLoader workers")
    times = []
    started = time.perf_counter()
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(DEVICE_S)
        if args.checkpoint and len(times) % 10 == 0:
            torch.save(model.state_dict(), args.checkpoint)
        now = time.perf_counter()
        times.append(now - started)
        started = now
    steady = times[WARMUP:]
    print(json.dumps({"steps": len(times), "mean_step_s": sum(steady) / len(steady)}))


if __name__ == "__main__":
    main()
