"""Overhead of `gpudoctor profile`: the same GPU jobs plain, profiled, and under an always-on profiler, side by side.

    PYTHONPATH=$PWD python3 bench/overhead.py [--workloads resnet,transformer,resnet18] [--seconds 60 | --steps N]
                                              [--pairs 2]
                                              [--modes plain,gpudoctor,always-on] [--batch-size N] [--small]
                                              [--run-timeout S]

For each workload (bench/workload_resnet.py, bench/workload_transformer.py) it calibrates a step count that takes
about --seconds plain, then runs the job in three modes, in alternating order within each pair: plain, under
`python -m gpudoctor profile` (default window), and under a bare torch.profiler that records every step and
exports its trace at the end (the export counts in its wall time). It prints a table per workload: each run's wall
time, the whole-job wall-time ratio to plain, the ratio of the job's own throughput after the profiling window
(plain / mode), the trace sizes, and the CPU that gpudoctor's samplers used in its own process; then each pair's
own wall ratio, how far apart the plain runs are (a ratio closer to 1 than that spread is not resolved), and each
run taken apart into the job's timed loop and the rest of its wall time (start-up, imports, the end: where
gpudoctor's fixed cost lies); last, whether gpudoctor meets its targets. A run that fails or runs past
--run-timeout (default 60 s + 5 × --seconds) is reported and the rest go on. --modes leaves modes out (the always-on
profiler takes the longest); --small shrinks the models for a quick try on a CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from figures import Figures, add_json_option
from overhead_runs import (
    AFTER_WINDOW_STEP,
    MODES,
    RUNNERS,
    SLOW_CLOCK_SHARE,
    ClockWatch,
    Run,
    RunFailed,
    Verdict,
    WorkloadRuns,
    describe_machine,
    last_json_line,
    run_command,
)

BENCH = Path(__file__).resolve().parent
WORKLOADS = {"resnet": BENCH / "workload_resnet.py", "transformer": BENCH / "workload_transformer.py",
             "resnet18": BENCH / "workload_resnet18.py"}
WALL_TARGET = 1.02
THROUGHPUT_TARGET = 1.01
PROBE_STEPS = 60
MIN_STEPS = 100

def job_options(args: argparse.Namespace) -> list[str]:
    options = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    return options + (["--small"] if args.small else [])


def calibrate_steps(python: str, script: Path, options: list[str], seconds: float,
                    timeout_s: float) -> tuple[float, int]:
    _, stdout, _ = run_command([python, str(script), "--steps", str(PROBE_STEPS), *options], timeout_s)
    rate = last_json_line(stdout)["steps_per_s_after_window"]
    return rate, max(MIN_STEPS, int(seconds * rate))


def run_pair(python: str, job: list[str], scratch: Path, results: WorkloadRuns, pair: int, timeout_s: float,
             modes: tuple[str, ...] = MODES, watch: ClockWatch | None = None) -> None:
    order = modes if pair % 2 == 0 else tuple(reversed(modes))
    done = []
    for mode in order:
        try:
            def one_run(mode: str = mode) -> Run:
                return RUNNERS[mode](python, job, scratch, f"{results.workload}-{pair}", timeout_s)

            run = watch.during(one_run) if watch else one_run()
        except RunFailed as failure:
            print(f"  {mode} failed: {failure}", flush=True)
            results.failures[mode].append(str(failure).splitlines()[0])
            done.append(f"{mode} failed")
        else:
            run.pair = pair
            results.runs[mode].append(run)
            done.append(f"{mode} {run.wall_s:.2f} s" + (f" ({run.clocks.describe()})" if run.clocks else ""))
    print(f"  pair {pair}: " + ", ".join(done), flush=True)


def median_wall(runs: list[Run]) -> float:
    return statistics.median(run.wall_s for run in runs)


def median_rate(runs: list[Run]) -> float:
    return statistics.median(run.job["steps_per_s_after_window"] for run in runs)


def trace_note(runs: list[Run]) -> str:
    sizes = [run.trace_mb for run in runs if run.trace_mb is not None]
    if runs[0].mode == "plain":
        return "-"
    if not sizes:
        return "no trace"
    size = f"{statistics.median(sizes):.2f} MB"
    if runs[0].mode == "gpudoctor":
        return f"{size} trace.json.gz"
    return f"{size} json (stop+export {statistics.median(run.stop_and_export_s for run in runs):.1f} s)"


def print_table(results: WorkloadRuns) -> Verdict:
    plain = results.runs["plain"]
    print(f"{'mode':<10} {'wall s per run':<16} {'wall ratio':>10} {'steps/s after window':>21} "
          f"{'throughput ratio':>17}  trace")
    ratios: dict[str, tuple[float | None, float | None]] = {}
    for mode in MODES:
        runs, failed = results.runs[mode], results.failures[mode]
        if not runs and not failed:  # a mode left out with --modes
            ratios[mode] = (None, None)
            continue
        ratios[mode] = (median_wall(runs) / median_wall(plain), median_rate(plain) / median_rate(runs)) \
            if runs and plain else (None, None)
        print(table_row(mode, runs, ratios[mode], failed))
    if results.runs["gpudoctor"]:
        print_pairs(plain, results.runs["gpudoctor"])
        print_sampler_costs(results.runs["gpudoctor"])
    print_trace_sizes(results)
    return Verdict(results.workload, *ratios["gpudoctor"])


def table_row(mode: str, runs: list[Run], ratios: tuple[float | None, float | None], failed: list[str]) -> str:
    walls = " ".join([f"{run.wall_s:.2f}" for run in runs] + ["failed"] * len(failed))
    wall_ratio, throughput_ratio = (f"{ratio:.3f}x" if ratio is not None else "-" for ratio in ratios)
    rate = f"{median_rate(runs):.1f}" if runs else "-"
    trace = trace_note(runs) if runs else f"({failed[0]})"
    return f"{mode:<10} {walls:<16} {wall_ratio:>10} {rate:>21} {throughput_ratio:>17}  {trace}"


def print_pairs(plain: list[Run], profiled: list[Run]) -> None:
    """Each pair's own ratio, the plain runs' spread (what the machine's noise allows to resolve), the runs the GPU
    slowed, and the runs taken apart: the job's timed loop, and the rest of the wall time, where gpudoctor's fixed
    cost lies."""
    slowed = slowed_runs(plain + profiled)
    if slowed:
        print(f"the GPU ran slower (median SM clock under {SLOW_CLOCK_SHARE:.0%} of the fastest run's) in: "
              + ", ".join(f"{r.mode} of pair {r.pair} ({r.clocks.describe()})" for r in slowed if r.clocks)
              + ": ratios with these runs compare the GPU's clocks, not gpudoctor")
    plain_by_pair = {run.pair: run for run in plain}
    pairs = [(run, plain_by_pair[run.pair]) for run in profiled if run.pair in plain_by_pair]
    if pairs:
        ratios = [run.wall_s / base.wall_s for run, base in pairs]
        print("wall ratio pair by pair: " + ", ".join(f"{ratio:.3f}x" for ratio in ratios)
              + f"; median {statistics.median(ratios):.3f}x")
        steady = [run.wall_s / base.wall_s for run, base in pairs if run not in slowed and base not in slowed]
        if slowed and steady:
            print(f"pairs with neither run slowed: {len(steady)}, median {statistics.median(steady):.3f}x")
    walls = [run.wall_s for run in plain]
    if len(walls) > 1:
        print(f"plain runs: {min(walls):.2f} to {max(walls):.2f} s, {max(walls) / min(walls) - 1:.1%} apart")
    for name, runs in (("plain", plain), ("gpudoctor", profiled)):
        print(f"{name:<10} the job's loop {statistics.median(r.loop_s for r in runs):8.2f} s, the rest of the run "
              f"{statistics.median(r.outside_loop_s for r in runs):6.2f} s (medians)")
    fixed = statistics.median(r.outside_loop_s for r in profiled) - statistics.median(r.outside_loop_s for r in plain)
    loop = statistics.median(r.loop_s for r in profiled) / statistics.median(r.loop_s for r in plain)
    print(f"gpudoctor adds {fixed:+.2f} s outside the job's loop; its loop ran {loop:.3f}x the plain loop's time")
    print_own_time(plain, profiled)
    windows = [r for r in profiled if r.window_s is not None and r.export_s is not None]
    if windows:
        print(f"gpudoctor's window, opened to trace written: {statistics.median(r.window_s for r in windows):.3f} s, "
              f"of which the trace's export {statistics.median(r.export_s for r in windows):.3f} s (medians)")


ACCOUNT = (("before the script's first line", "before_script_s"),
           ("from the script's first line to its loop", "job_start_s"),
           (f"the first {AFTER_WINDOW_STEP} steps, over their time at the pace after", "head_over_pace_s"),
           ("after the script's last line", "after_script_s"))


def print_own_time(plain: list[Run], profiled: list[Run]) -> None:
    """What gpudoctor adds, from each run's own clock: the phases around the job's work, which the job's own pace
    (its start-up, its throughput, the GPU's clocks) does not move, then the steps after the window."""
    print("what gpudoctor adds, phase by phase (medians, plain -> gpudoctor):")
    added = 0.0
    for title, name in ACCOUNT:
        before, after = (statistics.median(getattr(r, name) for r in runs) for runs in (plain, profiled))
        added += after - before
        print(f"  {title:<58} {before:7.3f} s -> {after:7.3f} s  {after - before:+.3f} s")
    step_ratio = median_rate(plain) / median_rate(profiled)
    print(f"  {'a step after the window':<58} {1e3 / median_rate(plain):7.3f} ms -> {1e3 / median_rate(profiled):.3f} "
          f"ms ({step_ratio:.3f}x; the plain runs' own spread: {rate_spread(plain):.1%})")
    wall = median_wall(plain)
    starts = [r.job_start_s for r in plain]
    print(f"  (the plain runs' own start, first line to loop, took {min(starts):.2f} to {max(starts):.2f} s)")
    print(f"  once per run: {added:+.2f} s, {1 + added / wall:.3f}x a plain run of {wall:.1f} s, "
          f"{1 + added / 600:.3f}x a 10-minute job; with the steps after the window at {step_ratio:.3f}x: "
          f"{(wall + added + (step_ratio - 1) * after_window_s(plain)) / wall:.3f}x this run")


def rate_spread(runs: list[Run]) -> float:
    rates = [run.job["steps_per_s_after_window"] for run in runs]
    return max(rates) / min(rates) - 1


def after_window_s(runs: list[Run]) -> float:
    """The plain runs' median time in the steps after the window."""
    return statistics.median(run.loop_s - run.job["head_s"] for run in runs)


def slowed_runs(runs: list[Run]) -> list[Run]:
    """The runs whose GPU clock ran well under the fastest run's (heat, power): empty without clock readings."""
    clocked = [run for run in runs if run.clocks]
    if not clocked:
        return []
    fastest = max(run.clocks.median_mhz for run in clocked if run.clocks)
    return [run for run in clocked if run.clocks and run.clocks.median_mhz < SLOW_CLOCK_SHARE * fastest]


def print_sampler_costs(runs: list[Run]) -> None:
    parts = []
    for name in ("host", "nvml"):
        percents = [run.sampler_core_percent[name] for run in runs if name in run.sampler_core_percent]
        if percents:
            samples = statistics.median(run.sampler_samples[name] for run in runs if name in run.sampler_samples)
            parts.append(f"{name} {statistics.median(percents):.2f}% ({samples:.0f} samples)")
        else:
            parts.append(f"{name} not measured ({runs[0].samplers_missing.get(name, 'unknown')})")
    print("gpudoctor's samplers, CPU in its own process as % of one core over the run: " + ", ".join(parts))


def print_trace_sizes(results: WorkloadRuns) -> None:
    always_on = [run.trace_mb for run in results.runs["always-on"] if run.trace_mb]
    gpudoctor = [run.trace_mb for run in results.runs["gpudoctor"] if run.trace_mb]
    if always_on and gpudoctor:
        always_on_mb, gpudoctor_mb = statistics.median(always_on), statistics.median(gpudoctor)
        print(f"trace size: always-on {always_on_mb:.2f} MB (json) vs gpudoctor {gpudoctor_mb:.2f} MB "
              f"(trace.json.gz), {always_on_mb / gpudoctor_mb:.0f}x")


def benchmark_workload(python: str, workload: str, args: argparse.Namespace, scratch: Path) -> Verdict:
    script, options = WORKLOADS[workload], job_options(args)
    if args.steps:
        steps = args.steps
        print(f"\n{workload}: {steps} steps per run ({' '.join(options) or 'default batch size'})", flush=True)
    else:
        try:
            rate, steps = calibrate_steps(python, script, options, args.seconds, args.run_timeout)
        except RunFailed as failure:
            print(f"\n{workload}: calibration failed: {failure}", flush=True)
            return Verdict(workload, None, None)
        print(f"\n{workload}: calibrated {rate:.1f} steps/s plain, {steps} steps per run "
              f"({' '.join(options) or 'default batch size'})", flush=True)
    job = [str(script), "--steps", str(steps), *options]
    results = WorkloadRuns(workload)
    watch = ClockWatch()
    for pair in range(args.pairs):
        run_pair(python, job, scratch, results, pair, args.run_timeout, args.modes, watch)
    return print_table(results)


def target_line(title: str, target: float, values: dict[str, float | None]) -> str:
    if any(value is None for value in values.values()):
        met = "not measured"
    else:
        met = "met" if all(value <= target for value in values.values()) else "missed"
    shown = ", ".join(f"{name} {value:.3f}x" if value is not None else f"{name} not measured"
                      for name, value in values.items())
    return f"{title} ≤ {target:.2f}x: {met} ({shown})"


def print_targets(verdicts: list[Verdict]) -> None:
    print()
    print(target_line("whole-job wall time", WALL_TARGET, {v.workload: v.wall_ratio for v in verdicts}))
    print(target_line("throughput outside window", THROUGHPUT_TARGET,
                      {v.workload: v.throughput_ratio for v in verdicts}))


def parse_workloads(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in WORKLOADS for name in names):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(WORKLOADS)} (comma-separated)")
    return names


def parse_modes(text: str) -> tuple[str, ...]:
    names = {name.strip() for name in text.split(",") if name.strip()} | {"plain"}
    if any(name not in MODES for name in names):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(MODES)} (comma-separated)")
    return tuple(mode for mode in MODES if mode in names)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=parse_workloads, default=list(WORKLOADS),
                        help="comma-separated, from: " + ", ".join(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=60.0, help="about how long one plain run takes")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run, instead of a count calibrated to take --seconds")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of all the modes, alternating their order")
    parser.add_argument("--modes", type=parse_modes, default=MODES,
                        help="comma-separated, from: " + ", ".join(MODES) + " (plain is always run)")
    parser.add_argument("--batch-size", type=int, default=None, help="each workload's own default if left out")
    parser.add_argument("--small", action="store_true", help="smaller models, for a quick try on a CPU")
    parser.add_argument("--run-timeout", type=float, default=None,
                        help="seconds before one run is killed and reported (default 60 + 5 × --seconds)")
    add_json_option(parser)
    args = parser.parse_args()
    if args.run_timeout is None:
        args.run_timeout = 60 + 5 * args.seconds
    return args


def main() -> None:
    args = parse_args()
    python = sys.executable
    machine = describe_machine(python)
    print(machine, flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpudoctor-bench-"))
    try:
        verdicts = [benchmark_workload(python, workload, args, scratch) for workload in args.workloads]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_targets(verdicts)
    figures = Figures("overhead", args.json, ["workload", "whole-job wall ratio", "throughput ratio after the window"])
    figures.set("machine", machine)
    for v in verdicts:
        figures.row(v.workload, *(f"{r:.3f}x" if r is not None else "not measured"
                                  for r in (v.wall_ratio, v.throughput_ratio)))
        figures.set(v.workload, {"wall_ratio": v.wall_ratio, "throughput_ratio": v.throughput_ratio})
    figures.write()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
