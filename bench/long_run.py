"""Sample files over a long run: bounded on disk and in memory, and what compacting them costs.

    PYTHONPATH=$PWD python3 bench/long_run.py [--hours 24]

Simulates --hours of sampling at 10 Hz into a scratch run dir, for all three sample files, with rows shaped as
the samplers write them: host.jsonl (16 cores' cpu_pct, load, memory, swap counters), procs.jsonl (a main
process of 20 threads and 8 worker processes of 3 threads each, with running CPU-second and context-switch
counters, per-thread CPU seconds included) and gpu.jsonl (one GPU: util, mem_util, mem_used, sm_mhz, power_w,
and PCIe on every tenth sample). Gauges cycle through precomputed random values; counters grow with the sample
number. Every row goes through gpudoctor's own SampleFile (its JsonlWriter and its `compact`), so what is
measured is the code path the samplers run.

The clock is simulated: sample i is stamped t = T0 + i / 10 s (plus a fixed sub-millisecond jitter, so that
times have as many digits as time.time()'s; gpu rows are stamped 37 ms after host and procs rows, as a
separate thread would), and rows are written as fast as they can be made. SampleFile schedules its
compactions by the wall clock (`due_for_compaction`); that is bypassed: after every 3,000th sample (300
simulated seconds, COMPACT_EVERY_S) the benchmark calls `SampleFile.compact(now=t, keep=spans)` on each file,
host and procs with the same `now`, as HostSampler does. `spans` are the profiling windows that `--every 10m`
would make: a 2-second window every 600 simulated seconds (the first 30 s in), written as window events
into the run's events.jsonl and read back by gpudoctor's WindowSpans, which keeps the latest windows raw
(with WINDOW_MARGIN_S on both sides, KEEP_RAW_S of them in all). Only the rows' times are simulated: disk
sizes, CPU times and memory are real.

Prints a table after 10 minutes and after every simulated hour: rows and MB of each file, the total MB, the
MB the same samples would take without compaction (every byte appended to the files, i.e. rows written x
mean raw row bytes) and the ratio, and the process's peak RSS so far. Then the cost of compaction per file:
calls, mean and max CPU seconds per call (time.process_time around each `compact`), the mean over the last
simulated hour, and those as % of one core (CPU per call / 300 s). Ends with a summary line, and the
benchmark's own wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from figures import Figures, add_json_option
from gpudoctor.bundle import EVENTS
from gpudoctor.launch.samplers import COMPACT_EVERY_S, PCIE_EVERY, SampleFile, WindowSpans

HZ = 10
T0 = 1_700_000_000.0
GPU_OFFSET_S = 0.037  # the gpu sampler runs in its own thread, so its rows have their own times
COMPACT_EVERY_SAMPLES = int(COMPACT_EVERY_S * HZ)
WINDOW_EVERY_S = 600.0  # --every 10m
WINDOW_FIRST_S = 30.0
WINDOW_S = 2.0
POOL = 1009  # precomputed gauge values, cycled (a prime, so no cycle lines up with PCIe or the tiers)
CLOCK_TICKS = 100
MB = 1e6
KINDS = ("host", "procs", "gpu")


# -- rows, shaped as collect.procfs and nvml write them ---------------------------------------------------
class HostRows:
    CORES = 16
    MEM_TOTAL = 270_000_000_000

    def __init__(self, rng: random.Random) -> None:
        self.cpu_pct = [[round(rng.uniform(2, 100), 1) for _ in range(self.CORES)] for _ in range(POOL)]
        self.load = [[round(rng.uniform(6, 12), 2), round(rng.uniform(7, 10), 2), round(rng.uniform(8, 9), 2)]
                     for _ in range(POOL)]
        self.mem_available = [rng.randrange(180_000_000_000, 200_000_000_000, 4096) for _ in range(POOL)]
        self.swap_used = [rng.randrange(0, 50_000_000, 4096) for _ in range(POOL)]

    def row(self, i: int, t: float) -> dict[str, Any]:
        k = i % POOL
        return {"t": t, "cpu_pct": self.cpu_pct[k], "load": self.load[k], "mem_total": self.MEM_TOTAL,
                "mem_available": self.mem_available[k], "swap_used": self.swap_used[k],
                "swap_in": i // 50 * 4096, "swap_out": i // 200 * 4096}


@dataclass
class SimulatedProcess:
    pid: int
    ppid: int
    name: str
    busy_permille: list[int]  # per thread, of one core
    rss_base: int
    rss: list[int] = field(default_factory=list)

    @property
    def tids(self) -> list[str]:
        return sorted(str(self.pid + n) for n in range(len(self.busy_permille)))

    def entry(self, i: int) -> dict[str, Any]:
        # Ticks of user and system time per thread; seconds as _tick_seconds computes them.
        user = [i * busy // 100 for busy in self.busy_permille]
        thread_cpu = {tid: u / CLOCK_TICKS + u // 9 / CLOCK_TICKS for tid, u in zip(self.tids, user)}
        total_user = sum(user)
        return {"pid": self.pid, "ppid": self.ppid, "name": self.name,
                "cpu_s": total_user / CLOCK_TICKS + total_user // 9 / CLOCK_TICKS, "rss": self.rss[i % POOL],
                "threads": len(self.busy_permille), "ctx_vol": i * 37 + i % 13, "ctx_invol": i // 7,
                "thread_cpu": thread_cpu}


class ProcsRows:
    def __init__(self, rng: random.Random) -> None:
        main = SimulatedProcess(4242, 4200, "python", [900, 300] + [rng.randrange(1, 50) for _ in range(18)],
                                3_100_000_000)
        workers = [SimulatedProcess(4400 + 10 * n, 4242, "pt_data_worker", [600, 20, 5], 900_000_000)
                   for n in range(8)]
        self.processes = [main, *workers]
        for process in self.processes:
            process.rss = [process.rss_base + rng.randrange(0, 40_000_000, 4096) for _ in range(POOL)]

    def row(self, i: int, t: float) -> dict[str, Any]:
        return {"t": t, "procs": [process.entry(i) for process in self.processes]}


class GpuRows:
    def __init__(self, rng: random.Random) -> None:
        self.util = [rng.randrange(60, 101) for _ in range(POOL)]
        self.mem_util = [rng.randrange(20, 70) for _ in range(POOL)]
        self.mem_used = [rng.randrange(60_000_000_000, 64_000_000_000, 2_097_152) for _ in range(POOL)]
        self.sm_mhz = [rng.choice((1755, 1785, 1980)) for _ in range(POOL)]
        self.power_w = [rng.randrange(300_000, 700_000) / 1000.0 for _ in range(POOL)]
        self.pcie_kbs = [rng.randrange(1_000, 2_000_000) for _ in range(POOL)]

    def row(self, i: int, t: float) -> dict[str, Any]:
        k = i % POOL
        gpu: dict[str, Any] = {"gpu": 0, "util": self.util[k], "mem_util": self.mem_util[k],
                               "mem_used": self.mem_used[k], "sm_mhz": self.sm_mhz[k], "power_w": self.power_w[k]}
        if i % PCIE_EVERY == 0:
            gpu["pcie_tx_kbs"], gpu["pcie_rx_kbs"] = self.pcie_kbs[k], self.pcie_kbs[-k]
        return {"t": t, "gpus": [gpu]}


# -- the simulated clock and the profiling windows -----------------------------------------------------
def sample_time(i: int, jitter: list[float]) -> float:
    return T0 + i / HZ + jitter[i % POOL]


class SimulatedWindows:
    """Writes the window events that `--every 10m` would make into the run's events.jsonl as the simulated
    clock passes them, and reads the spans to keep raw through gpudoctor's own WindowSpans."""

    def __init__(self, run_dir: Path) -> None:
        self._events = open(run_dir / EVENTS, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._reader = WindowSpans(run_dir / EVENTS)
        self._next_open = T0 + WINDOW_FIRST_S
        self._open_since: float | None = None

    def spans(self, now: float) -> list[tuple[float, float]]:
        while True:
            if self._open_since is not None and self._open_since + WINDOW_S <= now:
                self._write("closed", self._open_since + WINDOW_S)
                self._open_since = None
            elif self._open_since is None and self._next_open <= now:
                self._write("opened", self._next_open)
                self._open_since, self._next_open = self._next_open, self._next_open + WINDOW_EVERY_S
            else:
                break
        self._events.flush()
        return self._reader.spans()

    def _write(self, state: str, t: float) -> None:
        self._events.write(json.dumps({"kind": "window", "state": state, "t": t}, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._events.close()


# -- measuring ---------------------------------------------------------------------------------------------
@dataclass
class FileStats:
    file: SampleFile
    raw_bytes: int = 0  # every byte appended: what the file would hold without compaction
    size_after_compaction: int = 0
    cpu_s: list[float] = field(default_factory=list)  # per compaction

    def compact(self, now: float, keep: list[tuple[float, float]]) -> None:
        self.raw_bytes += self.file.path.stat().st_size - self.size_after_compaction
        started = time.process_time()
        self.file.compact(now, keep)
        self.cpu_s.append(time.process_time() - started)
        self.size_after_compaction = self.file.path.stat().st_size

    def rows(self) -> int:
        count = 0
        with open(self.file.path, "rb") as f:
            while chunk := f.read(1 << 20):
                count += chunk.count(b"\n")
        return count


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB  # ru_maxrss is in KiB on Linux


def hours_label(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:g} h"


TABLE_HEADER = (f"{'time':>7} | {'host rows':>9} {'MB':>6} | {'procs rows':>10} {'MB':>6} | {'gpu rows':>8} "
                f"{'MB':>6} | {'total MB':>8} {'raw MB':>8} {'ratio':>6} | {'peak RSS MB':>11}")


def print_checkpoint(elapsed_s: float, stats: dict[str, FileStats]) -> None:
    cells = []
    for kind in KINDS:
        width = 10 if kind == "procs" else 9 if kind == "host" else 8
        cells.append(f"{stats[kind].rows():>{width}} {stats[kind].size_after_compaction / MB:>6.2f}")
    total = sum(s.size_after_compaction for s in stats.values()) / MB
    raw = sum(s.raw_bytes for s in stats.values()) / MB
    print(f"{hours_label(elapsed_s):>7} | {' | '.join(cells)} | {total:>8.2f} {raw:>8.1f} {raw / total:>5.1f}x "
          f"| {peak_rss_mb():>11.1f}", flush=True)


def print_compaction_cost(stats: dict[str, FileStats]) -> float:
    """Prints the table; returns the mean share of one core the three files' compactions take together."""
    per_hour = int(3600 / COMPACT_EVERY_S)
    print(f"\ncompaction, every {COMPACT_EVERY_S:.0f} s (CPU s per call; % of one core = CPU per call / "
          f"{COMPACT_EVERY_S:.0f} s):")
    print(f"{'file':>6} | {'calls':>5} | {'mean s':>7} {'max s':>7} {'last h s':>8} | {'mean %':>7} "
          f"{'max %':>7} {'last h %':>8}")
    rows = {kind: s.cpu_s for kind, s in stats.items()}
    rows["all"] = [sum(calls) for calls in zip(*rows.values())]  # the three compactions of one moment
    for name, calls in rows.items():
        mean, peak, last_hour = statistics.mean(calls), max(calls), statistics.mean(calls[-per_hour:])
        share = [100 * x / COMPACT_EVERY_S for x in (mean, peak, last_hour)]
        print(f"{name:>6} | {len(calls):>5} | {mean:>7.3f} {peak:>7.3f} {last_hour:>8.3f} | {share[0]:>6.3f}% "
              f"{share[1]:>6.3f}% {share[2]:>7.3f}%")
    return 100 * statistics.mean(rows["all"]) / COMPACT_EVERY_S


# -- the run -----------------------------------------------------------------------------------------------
def simulate(run_dir: Path, hours: float, figures: Figures) -> None:
    rng = random.Random(7)
    makers = {"host": HostRows(rng), "procs": ProcsRows(rng), "gpu": GpuRows(rng)}
    jitter = [rng.randrange(0, 10_000) / 1e7 for _ in range(POOL)]
    stats = {kind: FileStats(SampleFile(run_dir, kind)) for kind in KINDS}
    windows = SimulatedWindows(run_dir)
    writers = {kind: (stats[kind].file.write, makers[kind].row) for kind in KINDS}
    samples = round(hours * 3600 / COMPACT_EVERY_S) * COMPACT_EVERY_SAMPLES
    checkpoints = {600 * HZ} | set(range(3600 * HZ, samples + 1, 3600 * HZ)) | {samples}
    print(TABLE_HEADER)
    for i in range(samples):
        t = sample_time(i, jitter)
        for kind, (write, make_row) in writers.items():
            write(make_row(i, t + GPU_OFFSET_S if kind == "gpu" else t))
        if (i + 1) % COMPACT_EVERY_SAMPLES == 0:
            keep = windows.spans(t)
            for file_stats in stats.values():
                file_stats.compact(t, keep)
            if i + 1 in checkpoints:
                print_checkpoint((i + 1) / HZ, stats)
    for file_stats in stats.values():
        file_stats.file.close()
    windows.close()
    core_share = print_compaction_cost(stats)
    total = sum(s.size_after_compaction for s in stats.values()) / MB
    raw = sum(s.raw_bytes for s in stats.values()) / MB
    peak_mb = peak_rss_mb()
    print(f"\ndisk after {hours_label(samples / HZ)}: {total:.1f} MB (raw would be {raw:.0f} MB, {raw / total:.0f}x "
          f"less); compaction: {core_share:.2f}% of one core; peak RSS: {peak_mb:.0f} MB")
    figures.set("hours", samples / HZ / 3600)
    figures.set("disk_mb", total)
    figures.set("raw_mb", raw)
    figures.set("compaction_core_percent", core_share)
    figures.set("peak_rss_mb", peak_mb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (rounded to 5 minutes)")
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("long_run", args.json)
    started = time.monotonic()
    run_dir = Path(tempfile.mkdtemp(prefix="gpudoctor-long-run-"))
    try:
        simulate(run_dir, args.hours, figures)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"wall time: {time.monotonic() - started:.0f} s")
    figures.write()


if __name__ == "__main__":
    main()
