"""Prints the start method of the default multiprocessing context and of the one asked for by name ("fork"), the
intra-op threads after the script sets its own, and those of a DataLoader worker started with "fork"."""

import json
import multiprocessing

import torch
from torch.utils.data import DataLoader, Dataset


class Threads(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return torch.get_num_threads()


if __name__ == "__main__":
    torch.set_num_threads(7)
    worker = DataLoader(Threads(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    print(json.dumps({"default": multiprocessing.get_start_method(),
                      "named": multiprocessing.get_context("fork").get_start_method(),
                      "threads": torch.get_num_threads(), "worker_threads": next(iter(worker))}))
