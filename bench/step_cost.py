"""What gpudoctor's always-on instrumentation costs each step, on a loop whose steps are tiny.

    PYTHONPATH=$PWD python3 bench/step_cost.py [--pairs 3] [--epochs 10]

A small MLP trains on the CPU (one intra-op thread) from a DataLoader, batch 8: steps of about 0.1 ms, so that
what gpudoctor adds per step shows against them. Each pair runs the loop plainly and under `gpudoctor profile
--wait-steps 100000` (no profiling window: the steps after the window are what this measures), in alternating
order. The loop times its own steps from step 500 on. It prints each run's time per step, the difference per
step and the ratio, and their medians: what gpudoctor adds to a step of 1 ms or 5 ms follows from the difference.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from figures import Figures, add_json_option

LOOP = r"""
import sys, time, torch
from torch import nn
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
steps, started = 0, None
for epoch in range(int(sys.argv[1])):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if steps == 500:
            started = time.perf_counter()
print(f"STEP_US {(time.perf_counter() - started) / (steps - 500) * 1e6:.2f}")
"""


def step_us(command: list[str], cwd: Path) -> float:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, check=True)
    match = re.search(r"STEP_US ([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"no STEP_US line from {command}: {done.stdout[-500:]} {done.stderr[-500:]}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10, help="epochs of 512 steps each")
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "loop.py").write_text(LOOP)
        plain_cmd = [sys.executable, "loop.py", str(args.epochs)]
        profiled_cmd = [sys.executable, "-m", "gpudoctor", "profile", "--wait-steps", "100000", "--out", "run",
                        "--format", "json", "loop.py", str(args.epochs)]
        rows = []
        for pair in range(args.pairs):
            order = [("plain", plain_cmd), ("gpudoctor", profiled_cmd)]
            if pair % 2:
                order.reverse()
            times = {name: step_us(cmd, cwd) for name, cmd in order}
            rows.append((times["plain"], times["gpudoctor"]))
            print(f"pair {pair}: plain {times['plain']:.1f} us/step, gpudoctor {times['gpudoctor']:.1f} us/step, "
                  f"+{times['gpudoctor'] - times['plain']:.1f} us ({times['gpudoctor'] / times['plain']:.3f}x)",
                  flush=True)
    added = statistics.median(g - p for p, g in rows)
    print(f"median: +{added:.1f} us a step ({statistics.median(g / p for p, g in rows):.3f}x on these steps); "
          f"{added / 1000:.1%} of a 1 ms step, {added / 5000:.1%} of a 5 ms step")
    figures = Figures("step_cost", args.json)
    figures.set("pairs_us_per_step", [{"plain": p, "gpudoctor": g} for p, g in rows])
    figures.set("added_us_per_step", added)
    figures.write()


if __name__ == "__main__":
    main()
