"""Samplers in gpudoctor's own process: the script's process tree, the host, and the GPUs.

They run here, never in the script's process, so that sampling cannot add GIL contention to what we
measure. Each sample is one JSON line, written as soon as it is taken. Counters are written as running
totals (CPU seconds, context switches, swap bytes); analysis turns them into rates.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.bundle import SAMPLE_FILES, SAMPLES_DIR, JsonlWriter
from gpudoctor.collect.nvml import Nvml, NvmlUnavailable

PCIE_EVERY = 10  # PCIe throughput is read on every tenth GPU sample: each read blocks for ~20 ms


class _Ticker(threading.Thread):
    """Calls `tick()` every `interval_s` until stopped; measures its own CPU time."""

    def __init__(self, name: str, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self.cpu_s = 0.0
        self.samples = 0

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stopped.is_set():
            self.tick()
            self.samples += 1
            self.cpu_s = time.thread_time()
            next_at += self.interval_s
            self._stopped.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)
        self.close()

    def tick(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HostSampler(_Ticker):
    """The host (per-core CPU, load, memory, swap) and every process of the script's tree."""

    def __init__(self, run_dir: Path, interval_s: float) -> None:
        super().__init__("gpudoctor-host-sampler", interval_s)
        self._host = JsonlWriter(run_dir / SAMPLES_DIR / SAMPLE_FILES["host"])
        self._procs = JsonlWriter(run_dir / SAMPLES_DIR / SAMPLE_FILES["procs"])
        self._root: psutil.Process | None = None
        self._known: dict[int, psutil.Process] = {}
        psutil.cpu_percent(percpu=True)  # the first call only sets the baseline

    def watch(self, pid: int) -> None:
        try:
            self._root = psutil.Process(pid)
        except psutil.Error:
            self._root = None

    def tick(self) -> None:
        t = time.time()
        self._host.write({"t": t, **_host_sample()})
        if self._root is not None:
            self._procs.write({"t": t, "procs": self._tree_sample()})

    def _tree_sample(self) -> list[dict[str, Any]]:
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            members = []
        # Keep one Process object per pid so psutil can tell a reused pid from the same process.
        current = {p.pid: self._known.get(p.pid, p) for p in members}
        self._known = current
        rows = []
        for process in current.values():
            row = _process_sample(process)
            if row is not None:
                rows.append(row)
        return rows

    def close(self) -> None:
        self._host.close()
        self._procs.close()


def _host_sample() -> dict[str, Any]:
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    return {
        "cpu_pct": psutil.cpu_percent(percpu=True), "load": list(psutil.getloadavg()),
        "mem_total": memory.total, "mem_available": memory.available,
        "swap_used": swap.used, "swap_in": swap.sin, "swap_out": swap.sout,
    }


def _process_sample(process: psutil.Process) -> dict[str, Any] | None:
    try:
        with process.oneshot():
            times = process.cpu_times()
            switches = process.num_ctx_switches()
            return {
                "pid": process.pid, "ppid": process.ppid(), "name": process.name(),
                "cpu_s": times.user + times.system, "rss": process.memory_info().rss,
                "threads": process.num_threads(), "ctx_vol": switches.voluntary, "ctx_invol": switches.involuntary,
                "thread_cpu": {str(th.id): th.user_time + th.system_time for th in process.threads()},
            }
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


class GpuSampler(_Ticker):
    def __init__(self, run_dir: Path, interval_s: float, nvml: Nvml) -> None:
        super().__init__("gpudoctor-gpu-sampler", interval_s)
        self._nvml = nvml
        self._out = JsonlWriter(run_dir / SAMPLES_DIR / SAMPLE_FILES["gpu"])

    def tick(self) -> None:
        t = time.time()
        self._out.write({"t": t, "gpus": self._nvml.sample(with_pcie=self.samples % PCIE_EVERY == 0)})

    def close(self) -> None:
        self._out.close()
        self._nvml.shutdown()


class Samplers:
    """Starts what can run on this machine and records, for the manifest, what could not and why."""

    def __init__(self, run_dir: Path, interval_s: float) -> None:
        self.collectors: dict[str, dict[str, Any]] = {}
        self.gpus: list[dict[str, Any]] = []
        self.driver: str | None = None
        self.host = HostSampler(run_dir, interval_s)
        self.collectors["host"] = {"ok": True, "interval_s": interval_s}
        self.gpu: GpuSampler | None = None
        try:
            nvml = Nvml()
            self.gpus, self.driver = nvml.describe()
            self.gpu = GpuSampler(run_dir, interval_s, nvml)
            self.collectors["nvml"] = {"ok": True, "interval_s": interval_s}
        except NvmlUnavailable as exc:
            self.collectors["nvml"] = {"ok": False, "reason": str(exc)}

    def start(self, pid: int) -> None:
        self.host.watch(pid)
        self.host.start()
        if self.gpu:
            self.gpu.start()

    def stop(self) -> None:
        for sampler in (self.host, self.gpu):
            if sampler is not None and sampler.is_alive():
                sampler.stop()
                self.collectors["host" if sampler is self.host else "nvml"].update(
                    samples=sampler.samples, sampler_cpu_s=round(sampler.cpu_s, 4))
