"""A training loop that writes its own log into the directory it is given, 80 kB every 10 steps, and exits 3:
what a full disk must leave whole (the log, the status) while gpudoctor records beside it."""

import sys
import time
from pathlib import Path

import torch


def main() -> None:
    log, steps = Path(sys.argv[1]), int(sys.argv[2])
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = model(torch.randn(64, 256)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.005)
        if step % 10 == 0:
            with open(log, "a") as f:
                f.write(f"step {step:05d}\n" * 8000)  # 11 bytes a line
    print("writes_log: done")
    sys.exit(3)


if __name__ == "__main__":
    main()
