"""Ends in the way its first argument names, after a few real training steps.

raise | exit3 | sigkill | hang | loop | nosteps | stuck_exit | slow_exit. `loop` trains until stopped.
`stuck_exit` finishes, then its process never exits: a native exit handler waits forever once Python has shut
down. `slow_exit` finishes, then takes its time at exit in a thread of its own and an atexit handler. `hang` and
`loop` write the file named by GD_TEST_READY once they are running, so that a test knows when to interrupt them.
"""

import atexit
import ctypes
import os
import signal
import sys
import threading
import time

import torch
from torch import nn


def train(steps: int) -> None:
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = model(torch.randn(4, 8)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)
        if step == 2 and os.environ.get("GD_TEST_READY"):
            open(os.environ["GD_TEST_READY"], "w").close()


def fail() -> None:
    raise RuntimeError("the script failed on purpose")


def main(how: str) -> None:
    if how == "nosteps":
        print(f"endings: {torch.ones(3).sum().item():.0f} without a step")
        return
    if how in ("loop", "hang"):
        train(10**9 if how == "loop" else 3)
        time.sleep(3600)
    train(4)
    if how == "raise":
        fail()
    elif how == "exit3":
        sys.exit(3)
    elif how == "stuck_exit":
        libc = ctypes.CDLL(None)  # pause() as a C exit handler: it runs after the interpreter has finalized
        libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)
    elif how == "slow_exit":
        threading.Thread(target=lambda: (time.sleep(3), print("endings: thread done", flush=True))).start()
        atexit.register(lambda: (time.sleep(3), print("endings: atexit done", flush=True)))
    elif how == "sigkill":
        time.sleep(0.5)  # let the parent take a few samples
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"endings: {how} finished normally")


if __name__ == "__main__":
    main(sys.argv[1])
