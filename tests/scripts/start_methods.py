"""Prints the start method of the default multiprocessing context and of the one asked for by name ("fork"), and
the intra-op threads after the script sets its own."""

import json
import multiprocessing

import torch

if __name__ == "__main__":
    torch.set_num_threads(7)
    print(json.dumps({"default": multiprocessing.get_start_method(),
                      "named": multiprocessing.get_context("fork").get_start_method(),
                      "threads": torch.get_num_threads()}))
