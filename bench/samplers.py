"""Cost of the parent's host and process-tree sampling, before and now, on the same process tree.

    PYTHONPATH=$PWD python3 bench/samplers.py --seconds 20 [--threads 20] [--workers 8]

Starts a training-like tree: a Python process with --threads threads that starts --workers worker
processes of 3 threads each; every thread wakes every 20 ms for a little work. Then, 10 times a second,
it takes one host sample and one tree sample with each of (a) the psutil-only sampler gpudoctor had
before (copied below as the baseline) and (b) gpudoctor's HostSampler as now written, in alternating
order, each writing its JSON lines to a scratch folder, and measures the CPU time each sample takes
(time.thread_time). Prints, per sampler, the processes and threads it saw, the CPU time per sample and
that as a share of one core at 10 samples per second; then the ratio and whether (b) is under 2% of one
core.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

from figures import Figures, add_json_option
from gpudoctor.bundle import SAMPLE_FILES, SAMPLES_DIR, JsonlWriter
from gpudoctor.launch.samplers import HostSampler

RATE_HZ = 10
TARGET_CORE_SHARE = 0.02

THREAD_LOOP = """
import os, sys, threading, time
def loop(parent=os.getppid()):
    while os.getppid() == parent:  # ends when the process that started this one is gone
        sum(range(1000))
        time.sleep(0.02)
def start_threads(n):
    for _ in range(n - 1):
        threading.Thread(target=loop, daemon=True).start()
"""
WORKER = THREAD_LOOP + """
start_threads(3)
print("ready", flush=True)
loop()
"""
MAIN = THREAD_LOOP + """
import subprocess
threads, workers = int(sys.argv[1]), int(sys.argv[2])
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[3]], stdout=subprocess.PIPE) for _ in range(workers)]
for p in procs:
    p.stdout.readline()
start_threads(threads)
print(" ".join(str(p.pid) for p in procs), flush=True)
loop()
"""


# -- (a) the baseline: the psutil-only sampling gpudoctor had before, one tick of it ---------------------
class PsutilOnlyBaseline:
    def __init__(self, run_dir: Path, pid: int) -> None:
        self._host = JsonlWriter(run_dir / SAMPLES_DIR / SAMPLE_FILES["host"])
        self._procs = JsonlWriter(run_dir / SAMPLES_DIR / SAMPLE_FILES["procs"])
        self._root = psutil.Process(pid)
        self._known: dict[int, psutil.Process] = {}
        psutil.cpu_percent(percpu=True)

    def tick(self) -> None:
        t = time.time()
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        self._host.write({
            "t": t, "cpu_pct": psutil.cpu_percent(percpu=True), "load": list(psutil.getloadavg()),
            "mem_total": memory.total, "mem_available": memory.available,
            "swap_used": swap.used, "swap_in": swap.sin, "swap_out": swap.sout,
        })
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            members = []
        current = {p.pid: self._known.get(p.pid, p) for p in members}
        self._known = current
        rows = [row for row in map(self._process_sample, current.values()) if row is not None]
        self._procs.write({"t": t, "procs": rows})

    @staticmethod
    def _process_sample(process: psutil.Process) -> dict[str, Any] | None:
        try:
            with process.oneshot():
                times = process.cpu_times()
                switches = process.num_ctx_switches()
                return {
                    "pid": process.pid, "ppid": process.ppid(), "name": process.name(),
                    "cpu_s": times.user + times.system, "rss": process.memory_info().rss,
                    "threads": process.num_threads(), "ctx_vol": switches.voluntary,
                    "ctx_invol": switches.involuntary,
                    "thread_cpu": {str(th.id): th.user_time + th.system_time for th in process.threads()},
                }
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return None
# -- end of the baseline ----------------------------------------------------------------------------------


def start_tree(threads: int, workers: int) -> tuple[subprocess.Popen, list[int]]:
    main = subprocess.Popen([sys.executable, "-c", textwrap.dedent(MAIN), str(threads), str(workers),
                             textwrap.dedent(WORKER)], stdout=subprocess.PIPE, text=True)
    return main, [int(pid) for pid in main.stdout.readline().split()]


def stop_tree(main: subprocess.Popen, workers: list[int]) -> None:
    main.kill()
    main.wait()
    for pid in workers:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def last_tree(run_dir: Path) -> tuple[int, int]:
    """Processes and threads in the last tree sample written to run_dir."""
    last = (run_dir / SAMPLES_DIR / SAMPLE_FILES["procs"]).read_text().splitlines()[-1]
    procs = json.loads(last)["procs"]
    return len(procs), sum(len(p["thread_cpu"]) for p in procs)


def measure(samplers: dict[str, Any], seconds: float) -> dict[str, list[float]]:
    """CPU seconds of each tick: every sampler ticks once per 1/RATE_HZ, in alternating order."""
    costs: dict[str, list[float]] = {name: [] for name in samplers}
    order = list(samplers)
    next_at = time.monotonic()
    for _ in range(int(seconds * RATE_HZ)):
        for name in order:
            started = time.thread_time()
            samplers[name].tick()
            costs[name].append(time.thread_time() - started)
        order.reverse()
        next_at += 1 / RATE_HZ
        time.sleep(max(0.0, next_at - time.monotonic()))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=20, help="threads of the main process")
    parser.add_argument("--workers", type=int, default=8, help="worker processes, 3 threads each")
    add_json_option(parser)
    args = parser.parse_args()
    tree, workers = start_tree(args.threads, args.workers)
    scratch = Path(tempfile.mkdtemp(prefix="gpudoctor-bench-samplers-"))
    try:
        baseline = PsutilOnlyBaseline(scratch / "a", tree.pid)
        current = HostSampler(scratch / "b", 1 / RATE_HZ)
        current.watch(tree.pid)
        time.sleep(1 / RATE_HZ)
        costs = measure({"a": baseline, "b": current}, args.seconds)
        seen = {"a": last_tree(scratch / "a"), "b": last_tree(scratch / "b")}
    finally:
        stop_tree(tree, workers)
        shutil.rmtree(scratch, ignore_errors=True)
    report(costs, seen, args)


def report(costs: dict[str, list[float]], seen: dict[str, tuple[int, int]], args: argparse.Namespace) -> None:
    labels = {"a": "(a) before: psutil only", "b": "(b) now: HostSampler"}
    print(f"tree: 1 main process with {args.threads} threads, {args.workers} workers with 3 threads each; "
          f"{psutil.cpu_count()} cores, {len(psutil.pids())} processes on the host")
    print(f"{'':26}{'processes':>10}{'threads':>9}{'samples':>9}{'ms/sample':>11}{'% of one core at 10 Hz':>24}")
    share = {}
    for name, label in labels.items():
        per_sample = sum(costs[name]) / len(costs[name])
        share[name] = per_sample * RATE_HZ
        procs, threads = seen[name]
        print(f"{label:26}{procs:>10}{threads:>9}{len(costs[name]):>9}{per_sample * 1e3:>11.3f}{share[name]:>23.2%}")
    met = "met" if share["b"] < TARGET_CORE_SHARE else "NOT met"
    print(f"before / now: {share['a'] / share['b']:.1f}x; target under {TARGET_CORE_SHARE:.0%} of one core: {met}")
    figures = Figures("samplers", args.json)
    for name, label in labels.items():
        figures.set(label, {"core_share": share[name], "samples": len(costs[name]),
                            "ms_per_sample": sum(costs[name]) / len(costs[name]) * 1e3, "tree": seen[name]})
    figures.write()


if __name__ == "__main__":
    main()
