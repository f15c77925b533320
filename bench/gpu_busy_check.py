"""An independent check of the budget's GPU busy share: NVML's utilization while fixture scripts run plainly.

    PYTHONPATH=$PWD python3 bench/gpu_busy_check.py [--out FILE]

Runs each fixture script below without gpudoctor and with more steps than its recording, samples NVML's GPU
utilization (the share of the last sample period in which a kernel ran) every 20 ms, and prints the mean over the
last half of its stepping time (by the script's own step time, ending 0.5 s before it exits: its set-up and its
final report left out), beside the GPU busy share of the committed fixture's budget: as split on the profiled steps,
and at the run's pace with the profiler's own cost left out (analysis.budget). The first five fixtures are ones the
profiler slowed; tiny_batch_ops_bad and healthy_trainer, which it did not, are controls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figures, add_json_option

ROOT = Path(__file__).resolve().parent.parent
STEPS = {"small_batch_bad": 6000, "healthy_transformer": 1200, "lm_manual_sgd_bad": 2000,
         "gan_two_optimizers_bad": 2500, "sync_point_bad": 600, "tiny_batch_ops_bad": 800, "healthy_trainer": 5000}
SAMPLE_S = 0.02
MAX_SAMPLES = 4000  # 80 s: a script running longer than that is stopped


def plain_run(name: str, steps: int, handle) -> tuple[list[tuple[float, int]], float, dict | None]:
    """The utilization samples taken while the script ran, when it ended, and its own last JSON line."""
    import pynvml

    with tempfile.TemporaryFile("w+") as log:  # a pipe left unread would fill and stall a script that prints
        script = ROOT / "fixtures" / "scripts" / f"{name}.py"
        proc = subprocess.Popen([sys.executable, str(script), "--steps", str(steps)],
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        samples = []
        while proc.poll() is None:
            samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            time.sleep(SAMPLE_S)
            if len(samples) > MAX_SAMPLES:
                proc.kill()
        end = time.time()
        proc.wait()
        log.seek(0)
        lines = log.read().strip().splitlines()
    return samples, end, _last_json(lines)


def _last_json(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def budget_busy(name: str) -> tuple[float, float]:
    """The committed fixture's GPU busy share: as split on its profiled steps, and at the run's pace."""
    from gpudoctor.analysis import Run
    from gpudoctor.analysis.budget import step_budget

    run = Run.from_bundle(ROOT / "fixtures" / "bundles" / name)
    paced = run.budget
    assert paced is not None
    profiled = step_budget(run.steps, run.gpu, run.trace, run.steady_wait_share, paced.step_s)
    assert profiled is not None

    def busy(budget) -> float:
        return sum(s.share for s in budget.slices if s.name in ("gpu_busy", "collective", "copy"))

    return busy(profiled), busy(paced)


def main() -> None:
    import pynvml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the samples and results here (JSON)")
    add_json_option(parser)
    args = parser.parse_args()
    columns = ["fixture", "NVML utilization, plain run", "budget: profiled steps", "budget: at the run's pace"]
    figures = Figures("gpu_busy_check", args.json, columns)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("| fixture | NVML utilization, plain run | budget: profiled steps | budget: at the run's pace |")
    print("| --- | --- | --- | --- |")
    results = {}
    for name, steps in STEPS.items():
        samples, end, result = plain_run(name, steps, handle)
        step_s = (result or {}).get("median_step_s") or 0.0
        start = end - 0.5 - 0.5 * steps * step_s
        steady = [util for t, util in samples if start <= t <= end - 0.5]
        profiled, paced = budget_busy(name)
        results[name] = {"util": statistics.fmean(steady) if steady else None, "samples": len(steady),
                         "step_s": step_s, "profiled": profiled, "paced": paced, "raw": samples}
        util = f"{results[name]['util']:.0f}%" if steady else "—"
        cells = [name, f"{util} ({len(steady)} samples, plain step {step_s * 1e3:.1f} ms)", f"{profiled:.0%}",
                 f"{paced:.0%}"]
        print(f"| {' | '.join(cells)} |", flush=True)
        figures.row(*cells)
        figures.set(name, {k: v for k, v in results[name].items() if k != "raw"})
    if args.out:
        args.out.write_text(json.dumps(results))
    figures.write()


if __name__ == "__main__":
    main()
