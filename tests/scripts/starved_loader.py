"""A training loop starved by its DataLoader: each sample takes 3 ms to make (a sleep, as reading a file would;
`--sample-ms`), and the loader makes them in the training process (num_workers=0, the default). Each step's device
work is a 20 ms sleep after a small model's step, as a GPU's would be on a machine that has none: on two shared
cores the timings then hold still. `--workers 2 --persistent` is its fixed twin. `--busy` makes each sample with
the CPU instead (3 ms of it, as decoding an image would). `--crash-with-workers` raises once the loader has workers
(a fix that breaks the script); `--checkpoint PATH` saves the model every 10 steps, as a training script does.

Prints one JSON line: the mean time of the steps after the first WARMUP, as the script measures them itself.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = 0.003
DEVICE_S = 0.020
BATCH = 8
WARMUP = 6


class SlowSamples(Dataset):
    def __init__(self, count: int, sample_s: float = SAMPLE_S, busy: bool = False) -> None:
        self.count, self.sample_s, self.busy = count, sample_s, busy

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.busy:  # the CPU time itself, however long a shared host takes to give it
            end = time.thread_time() + self.sample_s
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.sample_s)
        return torch.full((64,), float(index % 7)), torch.tensor(index % 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--crash-with-workers", action="store_true")
    parser.add_argument("--checkpoint")
    parser.add_argument("--sample-ms", type=float, default=SAMPLE_S * 1e3)
    parser.add_argument("--busy", action="store_true", help="each sample takes the CPU, not a sleep")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = SlowSamples(args.steps * BATCH, args.sample_ms / 1e3, args.busy)
    loader = DataLoader(samples, batch_size=BATCH, num_workers=args.workers, persistent_workers=args.persistent)
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
