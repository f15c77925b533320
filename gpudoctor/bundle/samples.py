"""samples/*.jsonl: the time series the parent samples, one row per sample (host, process tree, GPUs).

A row compacted for a long run (gpudoctor.bundle.compaction) merges several samples: it has the keys of a raw
row (gauges as their mean, counters as their last value) plus `t0` (its first sample), `n` (how many), `lo`
and `hi` (each gauge's extremes) and `counts` (for a gauge fewer samples had). `lowest` and `highest` read
raw and merged rows alike. A value the sampler could not read is left out, and read here as None.
"""

from __future__ import annotations

import msgspec

from gpudoctor.bundle.records import Count, Record, Seconds

Extremes = dict[str, "float | list[float]"]


class Merged(Record, omit_defaults=True, frozen=True):
    """What a compacted row or entry adds to a raw one."""

    t0: float | None = None
    n: Count | None = None
    lo: Extremes | None = None
    hi: Extremes | None = None
    counts: dict[str, int] | None = None

    def lowest(self, key: str) -> float | None:
        """The lowest value the gauge `key` took over the samples behind this row."""
        return _extreme(self.lo, key, getattr(self, key))

    def highest(self, key: str) -> float | None:
        """The highest value the gauge `key` took over the samples behind this row."""
        return _extreme(self.hi, key, getattr(self, key))


def _extreme(extremes: Extremes | None, key: str, value: float | None) -> float | None:
    found = extremes.get(key) if extremes else None
    return found if isinstance(found, (int, float)) else value


class HostRow(Merged, kw_only=True, frozen=True):
    t: float
    # per core, over the interval since the previous sample
    cpu_pct: list[float] = msgspec.field(default_factory=list)
    load: list[float] | None = None  # 1, 5 and 15 minute load averages
    mem_total: float | None = None
    mem_available: float | None = None
    swap_used: float | None = None
    swap_in: float | None = None  # bytes swapped in since boot: a counter
    swap_out: float | None = None
    # Under torchrun: CPU seconds (running totals) of each process of the job outside the script's own tree, by
    # pid: the other ranks on this host and their workers, the job's own demand rather than other programs'.
    job_cpu: dict[str, float] | None = None
    # Seconds some runnable task on the host waited for a core (Linux's /proc/pressure/cpu "some" total), and
    # seconds the script's cgroup was held back by its CPU limit (cpu.stat): running totals, None where not readable.
    cpu_pressure_s: float | None = None
    throttled_s: float | None = None


LOADER_WORKER_NAME = "pt_data_worker"  # the name torch gives a DataLoader worker process (ProcEntry.name)


class ProcEntry(Merged, kw_only=True, frozen=True):
    """One process of the script's tree. CPU seconds and context switches are running totals."""

    pid: int
    ppid: int | None = None
    name: str = ""
    cpu_s: Seconds = 0.0
    rss: float | None = None
    threads: float | None = None
    ctx_vol: float | None = None
    ctx_invol: float | None = None
    # CPU seconds of each thread, by OS thread id
    thread_cpu: dict[str, float] = msgspec.field(default_factory=dict)
    # Seconds the main thread was ready to run but waited for a core (Linux schedstat's run delay); None where
    # the kernel does not keep it
    run_delay_s: Seconds | None = None
    # The run delay of each thread, by OS thread id (/proc/PID/task/TID/schedstat); empty where not kept
    thread_run_delay: dict[str, float] = msgspec.field(default_factory=dict)
    # Whether it holds a GPU's device file (/dev/nvidiaN) open, as a process with a CUDA context does; None where
    # not looked at. A forked child inherits its parent's open files, so only a spawned one's says it used CUDA.
    gpu: bool | None = None


class ProcsRow(Merged, kw_only=True, frozen=True):
    t: float
    procs: list[ProcEntry] = msgspec.field(default_factory=list)


class GpuEntry(Merged, kw_only=True, frozen=True):
    """One GPU, from NVML; a field the driver does not support is None."""

    gpu: int
    util: float | None = None
    mem_util: float | None = None
    mem_used: float | None = None
    sm_mhz: float | None = None
    power_w: float | None = None
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None


GPU_GAUGES = ("util", "mem_util", "mem_used", "sm_mhz", "power_w", "pcie_tx_kbs", "pcie_rx_kbs")


class GpuRow(Merged, kw_only=True, frozen=True):
    t: float
    gpus: list[GpuEntry] = msgspec.field(default_factory=list)


HOST_ROWS = msgspec.json.Decoder(HostRow)
PROCS_ROWS = msgspec.json.Decoder(ProcsRow)
GPU_ROWS = msgspec.json.Decoder(GpuRow)
