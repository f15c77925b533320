"""A rank started by torch.multiprocessing.spawn gets two Ctrl-C a moment apart, as a job's rank does when the whole
process group is interrupted and then its parent's death sends it SIGINT again: the second is still pending in
Python as the first's KeyboardInterrupt leaves the rank's function (made deterministic as in ctrl_c_pending.py).
torch.multiprocessing swallows a rank's KeyboardInterrupt, so the process exits 0."""

import ctypes
import os
import signal

import torch
import torch.multiprocessing as mp
from torch import nn


def interrupted_twice(index: int) -> None:
    trip_ctrl_c = ctypes.pythonapi.PyErr_SetInterrupt
    trip_ctrl_c.restype = bytes.fromhex  # fails on the int it is given: the call errors, running no handler after it
    tripped = []

    def on_ctrl_c(signum, frame):
        if not tripped:
            tripped.append(signum)
            try:
                trip_ctrl_c()
            except TypeError:
                raise KeyboardInterrupt from None
        raise KeyboardInterrupt

    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    signal.signal(signal.SIGINT, on_ctrl_c)
    os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    mp.spawn(interrupted_twice, nprocs=1)
