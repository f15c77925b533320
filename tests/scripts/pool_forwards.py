"""Inference from a thread pool: each task calls the model, so every step ends on a worker thread.

With no optimizer, DataLoader or gpudoctor.step(), the model's forward calls are the steps, and they all
happen on the pool's threads while the main thread waits in `pool.map`: the profiling window opens,
and its hooks go on and off, while other threads are inside a forward.
"""

import argparse
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def serve(seed: int) -> int:
        values = [((seed * 31 + i) % 17) / 17.0 for i in range(2000)]  # Python work that holds the GIL
        with torch.inference_mode():
            return int(model(torch.tensor(values[:16]).unsqueeze(0)).argmax())

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(serve, range(args.requests)))
    print(f"pool_forwards: {len(answers)} answers")


if __name__ == "__main__":
    main()
