"""GD504 on the CPU: a training loop whose loader workers do CPU work while other programs spin on the host.

Two workers each spend 80 ms of CPU on a batch of 8; a step takes about 20 ms, so the workers keep both
cores busy on their own: the healthy twin's host is busy too, but with the job's own processes.

`--neighbours N` busy-loop processes are started through a launcher that exits at once, so they are not in
this script's process tree; they are killed when the loop ends and stop on their own after 30 s or once this
process is gone. `--neighbours 0` is the healthy twin. `--pids FILE` writes the neighbours' pids there.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NEIGHBOURS = Path(__file__).with_name("neighbours.py")


class BusyData(Dataset):
    def __init__(self, size: int, sample_s: float) -> None:
        self.size, self.sample_s = size, sample_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        end = time.perf_counter() + self.sample_s
        while time.perf_counter() < end:  # decoding, on the CPU
            pass
        return torch.full((8,), float(index)), index % 2


def start_neighbours(count: int) -> list[int]:
    if count == 0:
        return []
    launched = subprocess.run([sys.executable, str(NEIGHBOURS), "launch", str(os.getpid()), str(count), "30"],
                              capture_output=True, text=True, check=True, timeout=30)
    return [int(line) for line in launched.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--neighbours", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--pids")
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = BusyData(args.steps * args.batch_size, args.sample_ms / 1000)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers)
    neighbours = start_neighbours(args.neighbours)
    if args.pids:
        Path(args.pids).write_text("".join(f"{pid}\n" for pid in neighbours))
    try:
        time.sleep(0.3 if neighbours else 0.0)  # let them get going
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.compute_ms / 1000)  # stands for the GPU's compute
    finally:
        for pid in neighbours:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(f"noisy_neighbours: done with {len(neighbours)} neighbours")


if __name__ == "__main__":
    main()
