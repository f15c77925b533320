"""GD501 on the CPU: Python threads prepare batches (pure-Python work plus small torch ops) for the main thread.

`--threads N` feeder threads each build batches in Python and put them on a queue; the main thread takes
--batches-per-step of them per step, runs a tiny model and an optimizer step: the feeders take turns on the GIL.
`--threads 0` is the healthy twin: the main thread builds its own batches, one busy thread, nothing to contend with.
"""

import argparse
import queue
import threading

import torch
from torch import nn


def make_batch(seed: int, work: int) -> torch.Tensor:
    acc = 0
    for i in range(work):  # pure-Python preprocessing: holds the GIL
        acc = (acc * 31 + i + seed) % 1000003
    row = torch.tensor([float((acc + k) % 97) for k in range(8)])
    return torch.stack([row + k for k in range(4)]) / 97.0


def feed(out: queue.Queue, stop: threading.Event, seed: int, work: int) -> None:
    n = 0
    while not stop.is_set():
        batch = make_batch(seed * 1000 + n, work)
        n += 1
        while not stop.is_set():
            try:
                out.put(batch, timeout=0.05)
                break
            except queue.Full:
                pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--work", type=int, default=400_000)
    parser.add_argument("--batches-per-step", type=int, default=8)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches: queue.Queue = queue.Queue(maxsize=args.threads)
    stop = threading.Event()
    feeders = [threading.Thread(target=feed, args=(batches, stop, n, args.work), name=f"feeder-{n}", daemon=True)
               for n in range(args.threads)]
    for thread in feeders:
        thread.start()  # FEEDER START
    try:
        for _ in range(args.steps):
            if feeders:
                parts = [batches.get() for _ in range(args.batches_per_step)]
            else:  # one thread: the main thread builds its own batches
                parts = [make_batch(n, args.work) for n in range(args.batches_per_step)]
            batch = torch.cat(parts)
            loss = model(batch).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        stop.set()
        for thread in feeders:
            thread.join()
    print("gil_threads: done")


if __name__ == "__main__":
    main()
