"""Whether a longer warm-up would let the profiling window's steps run at their plain speed: every step's time through
a window of 30 steps, in a fresh process per plan.

    PYTHONPATH=$PWD python3 bench/window_warmup.py [--repeat 2] [--workloads tiny,trainer,launches] [--raw FILE]

If the cost of torch.profiler's CUDA activity were a start-up transient (CUPTI setting itself up), the steps late in
the window would run like the plain ones and more warm-up steps would remove the distortion. Each plan opens the
profiler (CUDA activity only, TEARDOWN_CUPTI=1, as gpudoctor's window) after step 40 of 100, on the launch-heavy
workloads of bench/profiler_cost.py and bench/window_transient.py, and keeps it open for 30 steps:

- `plain`: no profiler, the noise floor;
- `record`: recording all 30 steps;
- `prepare`: 10 warm-up steps (the profiler prepared, CUPTI on, nothing kept), then 20 recorded;
- `noext`: recording, with Kineto's external correlation off (`_ExperimentalConfig(disable_external_correlation=True)`);
- `sync`: recording, with a `torch.cuda.synchronize()` closing every step (the host cannot run ahead);
- `kernels`: recording the GPU's own records only (kernels, copies, memsets), no CUDA runtime or driver calls, with
  torch's activity filter (`activities=[{ProfilerActivity.CUDA: [...]}]`, where the installed torch has it);
- `noruntime`: recording, then CUPTI's runtime, driver and overhead records switched off (`cuptiActivityDisable`
  through ctypes), for a torch without the activity filter.

Each line gives, as ratios to the median step before the window (steps 20-39): the window's first step, the median
of its steps 2-10 and of its steps 21-30, and the median of the steps after it (from the third one on).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from figures import Figures, add_json_option

BENCH = Path(__file__).resolve().parent
PLANS = ("plain", "record", "prepare", "noext", "sync", "kernels", "noruntime")
GPU_RECORDS = ["CONCURRENT_KERNEL", "GPU_MEMCPY", "GPU_MEMSET"]
# CUpti_ActivityKind values (cupti_activity.h): the host-side records a timing window can do without
CUPTI_DRIVER, CUPTI_RUNTIME, CUPTI_OVERHEAD = 4, 5, 17
WORKLOADS = ("tiny", "trainer", "launches")
OPEN, LENGTH, PREPARED, STEPS = 40, 30, 10, 100


def _profiler(plan: str):
    from torch.profiler import ProfilerActivity, profile

    options = {}
    if plan == "noext":
        from torch._C._profiler import _ExperimentalConfig

        options["experimental_config"] = _ExperimentalConfig(disable_external_correlation=True)
    if plan == "kernels":
        return profile(activities=[{ProfilerActivity.CUDA: GPU_RECORDS}])  # TypeError where torch has no filter
    return profile(activities=[ProfilerActivity.CUDA], **options)


def _cupti_without_host_records() -> list[int]:
    """Switch CUPTI's runtime, driver and overhead records off in the loaded libcupti; each call's status."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcupti" in line}
    cupti = ctypes.CDLL(sorted(paths)[0])
    return [cupti.cuptiActivityDisable(kind) for kind in (CUPTI_DRIVER, CUPTI_RUNTIME, CUPTI_OVERHEAD)]


def run_plan(workload: str, plan: str, out: Path) -> list[float]:
    """Run one plan in this process; every step's host time, in seconds."""
    sys.path.insert(0, str(BENCH))
    import torch

    from profiler_cost import tiny, trainer
    from window_transient import launches

    step = {"tiny": tiny, "trainer": trainer, "launches": launches}[workload]("cuda")
    profiler, times = None, []
    for index in range(STEPS):
        if plan != "plain" and index == OPEN:
            profiler = _profiler(plan)
            if plan == "prepare":
                profiler.prepare_trace()  # CUPTI on, nothing kept until start_trace()
            else:
                profiler.start()
            if plan == "noruntime":
                print("cuptiActivityDisable:", _cupti_without_host_records(), file=sys.stderr)
        if plan == "prepare" and index == OPEN + PREPARED:
            profiler.start_trace()
        if profiler is not None and index == OPEN + LENGTH:
            profiler.stop()
            profiler.export_chrome_trace(str(out / f"{workload}-{plan}.json.gz"))
            profiler = None
        started = time.perf_counter()
        step()
        if plan == "sync":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    return times


def ratios(times: list[float]) -> tuple[float, float, float, float]:
    """First window step, its steps 2-10, its steps 21-30, and the steps after it, over the steps before it."""
    before = statistics.median(times[20:OPEN])
    first = times[OPEN] / before
    early = statistics.median(times[OPEN + 1:OPEN + 10]) / before
    late = statistics.median(times[OPEN + 20:OPEN + LENGTH]) / before
    after = statistics.median(times[OPEN + LENGTH + 2:]) / before
    return first, early, late, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated, from: " + ", ".join(PLANS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--raw", type=Path, help="write every step time here (JSON)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/window-warmup"))
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "PLAN"), help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(run_plan(args.one[0], args.one[1], args.out)))
        return
    raw: dict[str, list[list[float]]] = {}
    env = dict(os.environ, TEARDOWN_CUPTI="1")  # as gpudoctor's window: CUPTI detached once the trace is collected
    for _ in range(args.repeat):  # plans in turn, so that the machine's drift falls on every plan alike
        for workload in args.workloads.split(","):
            for plan in args.plans.split(","):
                done = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--one", workload, plan],
                                      capture_output=True, text=True, check=False, env=env)
                if done.returncode != 0:  # a plan this torch cannot run (no activity filter) is said, not fatal
                    print(f"{workload} {plan}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    continue
                raw.setdefault(f"{workload} {plan}", []).append(json.loads(done.stdout.strip().splitlines()[-1]))
                if args.raw:
                    args.raw.write_text(json.dumps(raw))
    print("over the median step before the window, each run: [first window step, window steps 2-10, "
          "window steps 21-30 | steps after the window]")
    for key, runs in raw.items():
        print(f"{key:18s} " + "  ".join("[{:.2f} {:.2f} {:.2f} | {:.2f}]".format(*ratios(t)) for t in runs))
    figures = Figures("window_warmup", args.json)
    for key, runs in raw.items():
        figures.set(key, [list(ratios(t)) for t in runs])
    figures.write()


if __name__ == "__main__":
    main()
