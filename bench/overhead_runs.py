"""One run of a workload in the overhead benchmark (bench/overhead.py): plainly, under `gpudoctor profile` or under an
always-on torch.profiler, timed in its own process group, with GPU 0's clocks watched while it runs and what
gpudoctor's run directory says of its window and its samplers."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("plain", "gpudoctor", "always-on")
MB = 1e6
AFTER_WINDOW_STEP = 20  # workload_common's: the jobs time their steps after gpudoctor's default window from here


# python -c ALWAYS_ON TRACE SCRIPT ARGS...: runs SCRIPT as `python SCRIPT ARGS` would, under a torch.profiler that
# records everything, exports the trace to TRACE, and reports on stderr how long stopping and exporting took.
ALWAYS_ON = (
    "import json, os, runpy, sys, time, torch\n"
    "from torch.profiler import profile, ProfilerActivity\n"
    "trace = sys.argv[1]\n"
    "sys.argv = sys.argv[2:]\n"
    "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))\n"
    "acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])\n"
    "with profile(activities=acts) as p:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "    job_ended = time.perf_counter()\n"
    "p.export_chrome_trace(trace)\n"
    "print(json.dumps({'stop_and_export_s': time.perf_counter() - job_ended}), file=sys.stderr)\n"
)

MACHINE = (
    "import json, os, platform, torch\n"
    "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'\n"
    "print(json.dumps({'gpu': gpu, 'cpus': os.cpu_count(), 'torch': torch.__version__,"
    " 'python': platform.python_version()}))\n"
)


class RunFailed(Exception):
    pass


# NVML's reasons for clocks below the maximum that come from heat or power (the rest: idle, settings, sync boost).
SLOWDOWN_REASONS = {0x04: "power cap", 0x08: "hardware slowdown", 0x20: "thermal (software)",
                    0x40: "thermal (hardware)", 0x80: "power brake"}
CLOCK_SAMPLE_S = 0.5
SLOW_CLOCK_SHARE = 0.95  # a run whose median SM clock is under this share of the fastest run's ran slower


@dataclass
class Clocks:
    """GPU 0 while a run went on: its median SM clock, its hottest reading, and the slowdowns NVML reported."""
    median_mhz: float
    max_temperature_c: int
    slowdowns: tuple[str, ...]

    def describe(self) -> str:
        slowed = f", slowed: {', '.join(self.slowdowns)}" if self.slowdowns else ""
        return f"SM {self.median_mhz:.0f} MHz, {self.max_temperature_c}°C{slowed}"


class ClockWatch:
    """Samples GPU 0's SM clock, temperature and slowdown reasons (NVML) from this process while a run goes on.

    The lent GPU machines throttle: on one, a job's plain runs took 45 and 56 s while its SM clock fell from 1980
    to 450-1000 MHz at 87°C. Wall ratios between runs at different clocks measure the GPU, not gpudoctor.
    """

    def __init__(self) -> None:
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML (a CPU try): the runs are timed without clocks
            return
        self._reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)  # the older name

    def during(self, run: Callable[[], Run]) -> Run:
        if self._handle is None:
            return run()
        samples: list[tuple[int, int, int]] = []
        done = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(samples, done), daemon=True)
        sampler.start()
        try:
            result = run()
        finally:
            done.set()
            sampler.join()
        if samples:
            reasons = 0
            for _, _, bits in samples:
                reasons |= bits
            result.clocks = Clocks(statistics.median(mhz for mhz, _, _ in samples), max(t for _, t, _ in samples),
                                   tuple(name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit))
        return result

    def _sample(self, samples: list[tuple[int, int, int]], done: threading.Event) -> None:
        n = self._nvml
        while not done.wait(CLOCK_SAMPLE_S):
            try:
                samples.append((n.nvmlDeviceGetClockInfo(self._handle, n.NVML_CLOCK_SM),
                                n.nvmlDeviceGetTemperature(self._handle, n.NVML_TEMPERATURE_GPU),
                                self._reasons(self._handle)))
            except n.NVMLError:
                return


@dataclass
class Run:
    mode: str
    wall_s: float
    job: dict
    trace_mb: float | None = None
    stop_and_export_s: float | None = None
    sampler_core_percent: dict[str, float] = field(default_factory=dict)
    sampler_samples: dict[str, int] = field(default_factory=dict)
    samplers_missing: dict[str, str] = field(default_factory=dict)
    pair: int = 0
    window_s: float | None = None  # gpudoctor's window, from its opening to its trace written
    clocks: Clocks | None = None
    exited_at: float = field(default_factory=time.time)  # made as the run's process ends: its end on the wall clock
    export_s: float | None = None  # of which writing the trace

    @property
    def loop_s(self) -> float:
        """The job's own timed loop, as the job measured it."""
        return self.job["wall_s"]

    @property
    def before_script_s(self) -> float:
        """From the command's start to the job script's first line (python's start, and what a wrapper adds)."""
        return self.job["started_at"] - (self.exited_at - self.wall_s)

    @property
    def job_start_s(self) -> float:
        """From the job script's first line to its loop: torch's import, CUDA's start, the model, the loader."""
        return self.job["loop_started_at"] - self.job["started_at"]

    @property
    def after_script_s(self) -> float:
        """From the job script's last line to the command's end (python's exit, and what a wrapper adds)."""
        return self.exited_at - self.job["ended_at"]

    @property
    def head_over_pace_s(self) -> float:
        """The first AFTER_WINDOW_STEP steps (gpudoctor's window among them) over their time at the later pace."""
        return self.job["head_s"] - AFTER_WINDOW_STEP / self.job["steps_per_s_after_window"]

    @property
    def outside_loop_s(self) -> float:
        """Everything else in the run's wall time: start-up, imports, the end, and what a wrapper adds around them."""
        return self.wall_s - self.loop_s


@dataclass
class WorkloadRuns:
    workload: str
    runs: dict[str, list[Run]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    failures: dict[str, list[str]] = field(default_factory=lambda: {mode: [] for mode in MODES})


@dataclass
class Verdict:
    workload: str
    wall_ratio: float | None
    throughput_ratio: float | None


def last_json_line(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        raise RunFailed("printed no JSON line")
    return json.loads(lines[-1])


def run_command(command: list[str], timeout_s: float) -> tuple[float, str, str]:
    """Runs the command in its own process group (killed whole past the timeout); returns wall, stdout, stderr."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RunFailed(f"ran past {timeout_s:.0f} s and was killed") from None
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise RunFailed(f"exit status {process.returncode}; its stderr ends:\n{stderr[-1500:]}")
    return wall, stdout, stderr


def describe_machine(python: str) -> str:
    _, stdout, _ = run_command([python, "-c", MACHINE], timeout_s=300)
    facts = last_json_line(stdout)
    return f"machine: {facts['gpu']}, {facts['cpus']} CPUs, torch {facts['torch']}, Python {facts['python']}"


def run_plain(python: str, job: list[str], scratch: Path, label: str, timeout_s: float) -> Run:
    wall, stdout, _ = run_command([python, *job], timeout_s)
    return Run("plain", wall, last_json_line(stdout))


def run_gpudoctor(python: str, job: list[str], scratch: Path, label: str, timeout_s: float) -> Run:
    run_dir = scratch / f"{label}-gpudoctor"
    wall, stdout, _ = run_command([python, "-m", "gpudoctor", "profile", "--out", str(run_dir), *job], timeout_s)
    run = Run("gpudoctor", wall, last_json_line(stdout))
    trace = run_dir / "trace.json.gz"
    run.trace_mb = trace.stat().st_size / MB if trace.is_file() else None
    read_sampler_costs(run, read_manifest(run_dir))
    read_window_times(run, run_dir)
    return run


def read_window_times(run: Run, run_dir: Path) -> None:
    """How long the first window took from its opening to its trace written, and the export in it (events.jsonl)."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return
    windows = [json.loads(line) for line in lines if '"kind":"window"' in line.replace(" ", "")]
    opened = next((w for w in windows if w.get("state") == "opened"), None)
    closed = next((w for w in windows if w.get("state") == "closed"), None)
    if opened and closed:
        run.window_s, run.export_s = closed["t"] - opened["t"], closed.get("export_s")


def read_manifest(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError) as error:
        return {"collectors": {name: {"reason": f"manifest.json unreadable: {error}"} for name in ("host", "nvml")}}


def read_sampler_costs(run: Run, manifest: dict) -> None:
    """CPU of the parent's samplers as % of one core over the run's duration, from the manifest's collectors."""
    duration = manifest.get("duration_s") or run.wall_s
    for name in ("host", "nvml"):
        collector = manifest.get("collectors", {}).get(name, {})
        if "sampler_cpu_s" in collector:
            run.sampler_core_percent[name] = 100 * collector["sampler_cpu_s"] / duration
            run.sampler_samples[name] = collector.get("samples", 0)
        else:
            run.samplers_missing[name] = collector.get("reason") or "no sampler_cpu_s in the manifest"


def run_always_on(python: str, job: list[str], scratch: Path, label: str, timeout_s: float) -> Run:
    trace = scratch / f"{label}-always-on.json"
    try:
        wall, stdout, stderr = run_command([python, "-c", ALWAYS_ON, str(trace), *job], timeout_s)
        run = Run("always-on", wall, last_json_line(stdout))
        run.stop_and_export_s = last_json_line(stderr)["stop_and_export_s"]
        run.trace_mb = trace.stat().st_size / MB
    finally:
        trace.unlink(missing_ok=True)
    return run


RUNNERS = {"plain": run_plain, "gpudoctor": run_gpudoctor, "always-on": run_always_on}
