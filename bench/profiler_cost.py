"""What torch.profiler's own settings cost a step, measured in blocks of steps alternating with plain ones.

    python3 bench/profiler_cost.py [--blocks 6] [--steps-per-block 20] [--out DIR]

Two workloads, both launch-heavy (the kind a profiler slows most): `tiny` (an MLP at batch 4, SGD) and
`trainer` (an MLP with AdamW, gradient clipping and a learning-rate schedule). Each is run in blocks of
steps, the blocks of each setting interleaved with plain blocks so that clocks and caches drift alike:

- `plain`: no profiler;
- `cuda`: CUDA activity only, no schedule (start, steps, stop): kernels, copies and runtime calls;
- `cuda+step`: the same with a schedule, so profiler.step() runs at every step;
- `cpu+cuda`: CPU operators as well;
- `cpu+cuda+shapes`: and record_shapes, the profiler settings of a detailed window.

Prints, per workload and setting, the median step and its ratio to plain. With --out it also writes
one CUDA-only trace and prints what it holds (event categories, whether ProfilerStep ranges are in it) and
how a runtime call's time in the trace lines up with time.time() read around it: the check that steps
timed by the recorder's own clock can be placed on a trace that has no step ranges.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from figures import Figures, add_json_option

SETTINGS = ("plain", "cuda", "cuda+step", "cpu+cuda", "cpu+cuda+shapes")


def mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def tiny(device: str):
    model = mlp(1024, 8).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 1024, device=device), torch.randint(0, 10, (4,), device=device)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def trainer(device: str):
    model = mlp(2048, 6).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s * 1e-4))
    x, y = torch.randn(256, 2048, device=device), torch.randint(0, 10, (256,), device=device)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    return step


def profiler_for(setting: str, steps: int):
    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []  # on a CPU, only the CPU to see
    if setting.startswith("cpu") or not activities:
        activities.append(ProfilerActivity.CPU)
    sched = schedule(wait=0, warmup=0, active=steps, repeat=1) if setting == "cuda+step" else None
    return profile(activities=activities, schedule=sched, record_shapes=setting.endswith("shapes"))


def block(step, setting: str, steps: int, sync) -> list[float]:
    """Step times of one block; the profiler (if any) is started before and stopped after the timed steps."""
    prof = None if setting == "plain" else profiler_for(setting, steps)
    if prof is not None:
        prof.start()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        if prof is not None and setting in ("cuda+step", "cpu+cuda", "cpu+cuda+shapes"):
            prof.step()
        times.append(time.perf_counter() - started)
    sync()
    if prof is not None:
        prof.stop()
    return times


def measure(name: str, make, blocks: int, steps: int, device: str, figures: Figures) -> None:
    step = make(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(20):
        step()
    sync()
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(blocks):
        for setting in SETTINGS:
            times[setting] += block(step, setting, steps, sync)[2:]  # a block's first steps pay its start
    plain = statistics.median(times["plain"])
    for setting in SETTINGS:
        median = statistics.median(times[setting])
        print(f"{name:8s} {setting:16s} {median * 1e3:8.3f} ms/step  {median / plain:5.2f}x plain", flush=True)
        figures.row(name, setting, f"{median * 1e3:.3f} ms", f"{median / plain:.2f}x")
        figures.set(f"{name} {setting}", {"median_s": median, "over_plain": median / plain})


def trace_contents(out: Path, device: str) -> None:
    step = tiny(device)
    path = out / "cuda_only.json.gz"
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    for _ in range(5):
        step()
    before = time.time()
    torch.cuda.synchronize()
    after = time.time()
    prof.stop()
    prof.export_chrome_trace(str(path))
    with gzip.open(path) as file:
        trace = json.loads(file.read())
    base = float(trace.get("baseTimeNanoseconds", 0)) / 1e9
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    print("categories:", dict(collections.Counter(e.get("cat") for e in events)))
    print("ProfilerStep ranges:", sum("ProfilerStep" in e.get("name", "") for e in events))
    syncs = [e for e in events if e.get("name") == "cudaDeviceSynchronize"]
    for e in syncs[-1:]:
        start, end = base + e["ts"] / 1e6, base + (e["ts"] + e["dur"]) / 1e6
        print(f"cudaDeviceSynchronize: starts {(start - before) * 1e6:.0f} us after time.time() before it, "
              f"ends {(after - end) * 1e6:.0f} us before time.time() after it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps-per-block", type=int, default=20)
    parser.add_argument("--out", type=Path)
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("profiler_cost", args.json, ["workload", "setting", "step", "over plain"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}")
    for name, make in (("tiny", tiny), ("trainer", trainer)):
        measure(name, make, args.blocks, args.steps_per_block, device, figures)
    figures.write()
    if args.out is not None and device == "cuda":
        args.out.mkdir(parents=True, exist_ok=True)
        trace_contents(args.out, device)


if __name__ == "__main__":
    main()
