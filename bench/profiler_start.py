"""How long a bare torch.profiler's start() and stop() block the script, with the activities of gpudoctor's window.

    PYTHONPATH=$PWD python3 bench/profiler_start.py [--runs 3] [--model mlp,conv]

Each run is a fresh process: it runs a few steps of a small model on the GPU (no optimizer), synchronizes, then
times `profile(activities=[CUDA]).start()`, five more steps and `stop()` (TEARDOWN_CUPTI=1 unless set), and once
more for a second window in the same process. It prints each run's times and their median per model. The first
start in a process is the slow one: in a script that has not imported torch's inductor (no optimizer does here),
torch.profiler's start imports it, which gpudoctor's own window avoids (bench/profiler_setup.py takes it apart).
The time start() blocks is paid once per window: the script stands still for it, so it counts in the whole-job
overhead (bench/overhead.py), not in any step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from figures import Figures, add_json_option

CHILD = r"""
import json, sys, time
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

kind = sys.argv[1]
if kind == "conv":
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(64, 10)).cuda()
    x = torch.randn(64, 3, 32, 32, device="cuda")
else:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    x = torch.randn(64, 256, device="cuda")


def steps(n):
    for _ in range(n):
        model(x).sum().backward()
    torch.cuda.synchronize()


steps(5)
times = {}
for window in ("first", "second"):
    started = time.perf_counter()
    profiler = profile(activities=[ProfilerActivity.CUDA])
    profiler.start()
    times[f"{window}_start_s"] = time.perf_counter() - started
    steps(5)
    started = time.perf_counter()
    profiler.stop()
    times[f"{window}_stop_s"] = time.perf_counter() - started
    steps(5)
print(json.dumps(times))
"""


def one_run(model: str) -> dict[str, float]:
    env = {**os.environ, "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI", "1")}
    done = subprocess.run([sys.executable, "-c", CHILD, model], check=False, capture_output=True, text=True,
                          env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the {model} run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per model")
    parser.add_argument("--model", default="mlp,conv", help="comma-separated: mlp, conv")
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("profiler_start", args.json)
    for model in args.model.split(","):
        runs = [one_run(model) for _ in range(args.runs)]
        for key in ("first_start_s", "first_stop_s", "second_start_s", "second_stop_s"):
            values = [run[key] for run in runs]
            shown = ", ".join(f"{v:.3f}" for v in values)
            print(f"{model:5s} {key:15s} median {statistics.median(values):.3f} s  [{shown}]", flush=True)
            figures.set(f"{model} {key}", {"median_s": statistics.median(values), "runs": values})
    figures.write()


if __name__ == "__main__":
    main()
