"""Where the first torch.profiler start in a process spends its time, and whether the script must stand still for it.

    PYTHONPATH=$PWD python3 bench/profiler_setup.py [--runs 3] [--plans main,cpu_first,no_context,eager,background]
        [--spy py-spy]

The first start of a profiler with CUDA activity in a process blocks the script for seconds on some machines (5.7
to 6.3 s on an H100, bench/profiler_start.py); later starts take milliseconds. Each plan is a fresh process that
trains a small conv net on the GPU and times what it is named for:

- main: the first start, as torch.profiler makes it (CUDA activity, TEARDOWN_CUPTI=1), after 20 steps;
- inductor_first: `import torch._inductor.config` timed first, then the start: torch.profiler's start asks
  `hasattr(torch, "_inductor")`, which imports inductor and dynamo in a script that has not;
- no_inductor: the start with that attribute answered "absent" without the import;
- cpu_first: a CPU-only profiler started and stopped first, then the CUDA start: is the cost Kineto's own set-up?
- no_context: the first CUDA start before the script has touched CUDA, then the steps and a second start;
- eager: main with CUDA_MODULE_LOADING=EAGER: does the cost grow with the kernels loaded?
- background: a CUDA profiler started and stopped in a second thread while the main thread keeps stepping; then
  the main thread's own start. Prints how long the main thread's steps took meanwhile: if they run at their
  usual pace, the set-up can be paid off the script's path.

With --spy, py-spy dumps the main plan's native stack 2 s into its first start (it needs ptrace rights).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from figures import Figures, add_json_option

CHILD = r"""
import json, os, sys, threading, time
plan = sys.argv[1]
times = {}
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only checks the plumbing
GPU = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU


def timed_start(activities):
    started = time.perf_counter()
    profiler = profile(activities=activities)
    profiler.start()
    return profiler, time.perf_counter() - started


def timed_stop(profiler):
    started = time.perf_counter()
    profiler.stop()
    return time.perf_counter() - started


if plan == "no_context":
    profiler, times["first_start_s"] = timed_start([GPU])
    times["first_stop_s"] = timed_stop(profiler)

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(64, 10)).to(device)
x = torch.randn(64, 3, 32, 32, device=device)


def step():
    started = time.perf_counter()
    model(x).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


before = [step() for _ in range(20)]
times["step_before_s"] = sorted(before)[len(before) // 2]

if plan == "cpu_first":
    profiler, times["cpu_start_s"] = timed_start([ProfilerActivity.CPU])
    times["cpu_stop_s"] = timed_stop(profiler)

if plan == "background":
    done = {}

    def warm():
        profiler, done["start_s"] = timed_start([GPU])
        done["stop_s"] = timed_stop(profiler)

    thread = threading.Thread(target=warm)
    started = time.perf_counter()
    thread.start()
    during = []
    while thread.is_alive():
        during.append(step())
    times["background_s"] = time.perf_counter() - started
    times["background_start_s"] = done.get("start_s", float("nan"))
    times["steps_during"] = len(during)
    times["step_during_median_s"] = sorted(during)[len(during) // 2] if during else float("nan")
    times["step_during_max_s"] = max(during, default=float("nan"))

if plan == "inductor_first":
    started = time.perf_counter()
    import torch._inductor.config
    times["import_inductor_s"] = time.perf_counter() - started

print("starting", flush=True)
key = "second_start_s" if plan == "no_context" else "first_start_s"
if plan == "no_inductor":  # torch.profiler asks hasattr(torch, "_inductor"), which imports it: say no instead
    lazy = torch.__dict__["__getattr__"]

    def without_inductor(name):
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = without_inductor
    profiler, times[key] = timed_start([GPU])
    torch.__getattr__ = lazy
    times["inductor_imported"] = float("torch._inductor" in sys.modules)
else:
    profiler, times[key] = timed_start([GPU])
for _ in range(5):
    step()
times[key.replace("start", "stop")] = timed_stop(profiler)
after = [step() for _ in range(20)]
times["step_after_s"] = sorted(after)[len(after) // 2]
print(json.dumps(times), flush=True)
"""

PLANS = ("main", "inductor_first", "no_inductor", "cpu_first", "no_context", "eager", "background")


def one_run(plan: str, spy: str | None) -> dict[str, float]:
    env = {**os.environ, "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI", "1")}
    if plan == "eager":
        env["CUDA_MODULE_LOADING"] = "EAGER"
    child = subprocess.Popen([sys.executable, "-c", CHILD, plan], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if line.startswith("starting") and spy and plan == "main":
            time.sleep(2.0)
            dump = subprocess.run([spy, "dump", "--native", "--pid", str(child.pid)], capture_output=True,
                                  text=True, check=False)
            print(f"--- py-spy dump 2 s into the first start (exit {dump.returncode}):\n{dump.stdout}{dump.stderr}",
                  flush=True)
            spy = None
    child.wait(timeout=300)
    if child.returncode != 0:
        assert child.stderr is not None
        raise RuntimeError(f"the {plan} run failed: {child.stderr.read().strip().splitlines()[-3:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per plan, the plans taken in turn")
    parser.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated: {', '.join(PLANS)}")
    parser.add_argument("--spy", help="py-spy executable: dump the main plan's stack during its first start")
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("profiler_setup", args.json)
    plans = args.plans.split(",")
    results: dict[str, list[dict[str, float]]] = {plan: [] for plan in plans}
    for run in range(args.runs):
        for plan in plans:
            results[plan].append(one_run(plan, args.spy if run == 0 else None))
    for plan, runs in results.items():
        for key in runs[0]:
            values = [r[key] for r in runs if key in r]
            shown = ", ".join(f"{v:.4f}" for v in values)
            print(f"{plan:10s} {key:22s} median {statistics.median(values):9.4f}  [{shown}]", flush=True)
            figures.set(f"{plan} {key}", {"median": statistics.median(values), "runs": values})
    figures.write()


if __name__ == "__main__":
    main()
