"""Overhead of `gpudoctor profile`: the same GPU job plain and profiled, alternating, side by side.

    PYTHONPATH=$PWD python3 bench/overhead.py --seconds 60 --pairs 2

Calibrates a step count that takes about --seconds plain, then alternates plain and profiled runs
(default window) and prints each run's wall time, the median wall-time ratio, and the ratio of the
job's own throughput after the profiling window. With --always-on it also runs the job under a bare
torch.profiler that records every step, to show what the bounded window saves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = Path(__file__).with_name("workload_resnet.py")
ALWAYS_ON = (
    "import runpy, sys, torch\n"
    "from torch.profiler import profile, ProfilerActivity\n"
    "sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
    "acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])\n"
    "with profile(activities=acts) as p:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "p.export_chrome_trace(sys.argv[0] + '.always-on.json')\n"
)


def run(command: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    line = next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{"))
    return wall, json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--always-on", action="store_true")
    parser.add_argument("--batch-size", type=int, default=128, help="smaller for a quick try on a CPU")
    args = parser.parse_args()
    python = sys.executable
    _, probe = run([python, str(WORKLOAD), "--steps", "60", "--batch-size", str(args.batch_size)])
    rate = probe["steps_per_s_after_window"]
    steps = max(100, int(args.seconds * rate))
    print(f"calibrated: {rate:.1f} steps/s, {steps} steps per run")
    job = [str(WORKLOAD), "--steps", str(steps), "--batch-size", str(args.batch_size)]
    out = Path(tempfile.mkdtemp(prefix="gpudoctor-bench-"))
    plain, profiled, always = [], [], []
    for pair in range(args.pairs):
        plain.append(run([python, *job]))
        run_dir = out / f"run{pair}"
        profiled.append(run([python, "-m", "gpudoctor", "profile", "--out", str(run_dir), *job]))
        if args.always_on:
            always.append(run([python, "-c", ALWAYS_ON, *job]))
        print(f"pair {pair}: plain {plain[-1][0]:.2f} s, profiled {profiled[-1][0]:.2f} s"
              + (f", always-on profiler {always[-1][0]:.2f} s" if always else ""))
    wall_ratio = statistics.median(w for w, _ in profiled) / statistics.median(w for w, _ in plain)
    rate_ratio = (statistics.median(r["steps_per_s_after_window"] for _, r in plain)
                  / statistics.median(r["steps_per_s_after_window"] for _, r in profiled))
    print(f"whole-job wall-time ratio (profiled / plain): {wall_ratio:.3f}")
    print(f"throughput ratio outside the window (plain / profiled): {rate_ratio:.3f}")
    if always:
        print(f"always-on torch.profiler wall-time ratio: {statistics.median(w for w, _ in always) / statistics.median(w for w, _ in plain):.3f}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
