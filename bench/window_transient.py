"""How a profiling window's steps run compared with the steps around it, step by step, in a fresh process per plan.

    python3 bench/window_transient.py [--repeat 2] [--steps 100]

bench/profiler_cost.py measures a warmed-up profiler (blocks alternating in one process). A profiling window
in a user's job is the first profiler start of its process, and that start may cost the steps after it more
than a warmed-up profiler does. Each plan below runs in a process of its own, on the launch-heavy workloads of
profiler_cost.py and on `launches` (2,000 kernel launches a step, nothing else), and prints every step's host
time around the window (no synchronize in the step):

- `plain`: no profiler;
- `window`: CUDA activity from step 40, stopped and exported after 7 steps (2 warm-up + 5 timed, gpudoctor's
  default window);
- `primer`: a profiler started and stopped at once (no step recorded, nothing exported) at step 3, then the
  window at step 40;
- `primer-only`: the primer at step 3 and no window;
- `teardown`: the window, with TEARDOWN_CUPTI=1 in the environment, so that Kineto detaches CUPTI
  (cuptiFinalize) once the window's trace is collected: what gpudoctor's window does;
- `long`: the window recording 20 steps;
- `twice`: the window at step 40 and again at step 70;
- `pause`: no profiler, but the main thread sleeps 0.1 s after step 40 and after step 47 (as a profiler's start
  and export keep it away).

The processes run in turn (plan a, b, c, a, b, c, ...) so that the machine's drift falls on every plan alike.
Each line gives the median step before the window (steps 20-39), in its warm-up (40-41) and timed (42-46)
steps, in the five steps after it (47-51) and long after it (60-69), each as a ratio to the median before,
and the window's distortion as gpudoctor reports it: the timed steps' median over that of the steps after the
window (52 to the end). A plan without a window gives the same ratios for the same steps: the noise floor.
With --raw every step time goes to a JSON file.
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

PLANS = ("plain", "window", "primer", "primer-only", "teardown", "long", "twice", "pause")
WORKLOADS = ("tiny", "trainer", "launches")
OPEN, TIMED = 40, 7  # the window opens after step OPEN and records TIMED steps
SPANS = {"before": (20, 40), "warm-up": (40, 42), "timed": (42, 47), "after": (47, 52), "later": (60, 70)}
LATE_FROM = 60  # steps this far on show what the window left behind
DISTORTION_FROM = 52  # steps after the window that gpudoctor compares the timed ones with


def launches(device: str):
    """A step of 2,000 kernel launches on a small tensor: nothing but launch overhead, long enough to time steadily."""
    import torch

    x = torch.ones(64, device=device)

    def step() -> None:
        y = x
        for _ in range(2000):
            y = y * 1.0001
        return None

    return step


def profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA])


def run_plan(workload: str, plan: str, steps: int, out: Path) -> list[float]:
    """Run one plan in this process; the step times, in seconds."""
    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    from profiler_cost import tiny, trainer

    step = {"tiny": tiny, "trainer": trainer, "launches": launches}[workload]("cuda")
    windows = {"window": [(OPEN, TIMED)], "teardown": [(OPEN, TIMED)], "primer": [(OPEN, TIMED)], "long": [(OPEN, 20)],
               "twice": [(OPEN, TIMED), (OPEN + 30, TIMED)]}.get(plan, [])
    starts = dict(windows)
    prof, stop_at = None, -1
    times = []
    for index in range(steps):
        if plan in ("primer", "primer-only") and index == 3:
            primer = profiler()
            primer.start()
            primer.stop()
        if plan == "pause" and index in (OPEN, OPEN + TIMED):
            time.sleep(0.1)
        if index in starts:
            prof, stop_at = profiler(), index + starts[index]
            prof.start()
        if index == stop_at and prof is not None:
            prof.stop()
            prof.export_chrome_trace(str(out / f"{workload}-{plan}-{index}.json.gz"))
            prof = None
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    return times


def summarise(times: list[float]) -> dict[str, float]:
    return {name: statistics.median(times[a:b]) for name, (a, b) in SPANS.items() if b <= len(times)}


def left_behind(times: list[float]) -> float:
    """How much slower the steps long after the window run than those before it."""
    return statistics.median(times[LATE_FROM:]) / statistics.median(times[10:40])


def distortion(times: list[float]) -> float:
    a, b = SPANS["timed"]
    return statistics.median(times[a:b]) / statistics.median(times[DISTORTION_FROM:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated, from: " + ", ".join(PLANS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--raw", type=Path, help="write every step time here (JSON)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/window-transient"))
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "PLAN"), help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(run_plan(args.one[0], args.one[1], args.steps, args.out)))
        return
    plans, workloads = args.plans.split(","), args.workloads.split(",")
    print(f"{'workload':8s} {'plan':11s} {'before ms':>9s} "
          + " ".join(f"{n:>8s}" for n in SPANS if n != "before") + "  distortion")
    raw: dict[str, list[list[float]]] = {}
    for _ in range(args.repeat):
        for workload in workloads:
            for plan in plans:
                env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}  # Kineto's default: attached
                if plan == "teardown":
                    env["TEARDOWN_CUPTI"] = "1"
                done = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--out", str(args.out),
                                       "--one", workload, plan], capture_output=True, text=True, check=True, env=env)
                times = json.loads(done.stdout.strip().splitlines()[-1])
                raw.setdefault(f"{workload} {plan}", []).append(times)
                medians = summarise(times)
                before = medians.pop("before")
                ratios = " ".join(f"{value / before:7.2f}x" for value in medians.values())
                print(f"{workload:8s} {plan:11s} {before * 1e3:9.3f} {ratios}  {distortion(times):9.2f}x", flush=True)
                if args.raw:
                    args.raw.write_text(json.dumps(raw))
    print("distortion (timed steps over the steps after the window), median of the runs [all]:")
    for key, runs in raw.items():
        values = sorted(distortion(times) for times in runs)
        print(f"  {key:22s} {statistics.median(values):5.2f}x  [{', '.join(f'{v:.2f}' for v in values)}]")
    print(f"steps {LATE_FROM}+ over steps 10-39 (what the window leaves behind), median of the runs [all]:")
    for key, runs in raw.items():
        values = sorted(left_behind(times) for times in runs)
        print(f"  {key:22s} {statistics.median(values):5.2f}x  [{', '.join(f'{v:.2f}' for v in values)}]")
    figures = Figures("window_transient", args.json)
    for key, runs in raw.items():
        figures.set(key, {"distortion": [distortion(t) for t in runs], "left_behind": [left_behind(t) for t in runs]})
    figures.write()


if __name__ == "__main__":
    main()
