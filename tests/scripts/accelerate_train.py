"""Trains a small model with Hugging Face Accelerate, on the CPU; `accelerate launch --multi_gpu --num_processes N`
runs N ranks of it (gloo), through torchrun's launcher inside accelerate's own process.

It ends its process group, and gloo's threads, before the interpreter shuts down, as spawn_ddp.py explains.
"""

import argparse
import sys

import torch
import torch.distributed.nn  # before any process group exists (spawn_ddp.py says why)
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1)), batch_size=32)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    done = 0
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        done += 1
        if done == args.steps:
            break
    # One write for the whole line: the ranks share stdout, and print() writes the newline apart.
    sys.stdout.write(f"accelerate_train: rank {accelerator.process_index} of {accelerator.num_processes} did {done} "
                     "steps\n")
    sys.stdout.flush()
    del model  # it holds the group, as does the accelerator until free_memory(): end_training() then ends it
    accelerator.free_memory()
    accelerator.end_training()  # destroy_process_group()


if __name__ == "__main__":
    main()
