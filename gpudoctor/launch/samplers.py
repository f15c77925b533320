"""Samplers in gpudoctor's own process: the script's process tree, the host, and the GPUs.

They run here, never in the script's process, so that sampling cannot add GIL contention to what we
measure. Each sample is one JSON line, written as soon as it is taken. Counters are written as running
totals (CPU seconds, context switches, swap bytes); analysis turns them into rates. How the host and the
tree are read is in launch.readers.

For a run of hours the files stay bounded: every few minutes each one is compacted (bundle.compaction),
older samples merged into coarser rows that keep their extremes, except around the profiling windows,
whose samples stay as they were taken.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import msgspec

from gpudoctor.bundle import EVENTS, SAMPLE_FILES, SAMPLES_DIR, JsonlWriter
from gpudoctor.bundle.compaction import compact_file
from gpudoctor.bundle.events import WindowEvent
from gpudoctor.bundle.jsonio import JsonlTail
from gpudoctor.bundle.manifest import CollectorStatus, GpuInfo
from gpudoctor.bundle.samples import GpuRow, HostRow, ProcsRow
from gpudoctor.launch.cpu_limits import CpuLimits
from gpudoctor.launch.nvml import Nvml, NvmlUnavailable
from gpudoctor.launch.procfiles import PROCFS, ProcFiles, held_files_budget
from gpudoctor.launch.ranks import torchrun_rank
from gpudoctor.launch.readers import TreeReader, host_reader, tree_reader

PCIE_EVERY = 10  # PCIe throughput is read on every tenth GPU sample: each read blocks for ~20 ms
# Compacting reads a file twice: every 5 minutes, the three files cost about 0.2% of a core over a day
# (bench/long_run.py, docs/performance.md).
COMPACT_EVERY_S = 300.0
# Samples this close to a profiling window stay raw: analysis takes those within 0.5 s of the window's steps.
WINDOW_MARGIN_S = 2.0
# Raw samples are kept around the latest windows only, up to this much time in all (3,000 rows at 10 Hz),
# so that the files stay under the compaction's row cap however many windows --every opens.
KEEP_RAW_S = 300.0


class WindowSpans:
    """The profiling windows so far, read from the script's events.jsonl as it grows (only new bytes each time)."""

    def __init__(self, events: Path) -> None:
        self._tail = JsonlTail(events, WINDOW_EVENTS)
        self._opened: float | None = None
        self._spans: list[tuple[float, float]] = []

    def spans(self) -> list[tuple[float, float]]:
        """(start, end) of the latest windows, margins included, KEEP_RAW_S of them in all (a window still
        open, which ends in the future, always)."""
        for event in self._tail.read():
            self._on_window(event)
        kept, total = [], 0.0
        for start, end in reversed(self._spans):
            total += end - start
            if total > KEEP_RAW_S:
                break
            kept.append((start, end))
        still_open = [(self._opened - WINDOW_MARGIN_S, float("inf"))] if self._opened is not None else []
        return kept[::-1] + still_open

    def _on_window(self, event: WindowEvent) -> None:
        t = event.t or 0.0
        if event.state == "opened":
            self._opened = t
        elif self._opened is not None:  # closed, failed or ended early
            self._spans.append((self._opened - WINDOW_MARGIN_S, t + WINDOW_MARGIN_S))
            self._opened = None


# Only the window events of events.jsonl: a line of another kind fails at its "kind", the first key, and is skipped.
WINDOW_EVENTS = msgspec.json.Decoder(WindowEvent)


class SampleFile:
    """One sample file: rows appended as they are taken, and compacted every COMPACT_EVERY_S."""

    def __init__(self, run_dir: Path, kind: str) -> None:
        self.kind = kind
        self.path = run_dir / SAMPLES_DIR / SAMPLE_FILES[kind]
        self._writer = JsonlWriter(self.path)
        self._next_compaction = time.time() + COMPACT_EVERY_S

    def write(self, row: HostRow | ProcsRow | GpuRow) -> None:
        self._writer.write(row)

    @property
    def failed(self) -> OSError | None:
        """Why the file stopped taking samples (disk full, say), if it did: sampling into it stops there."""
        return self._writer.failed

    def due_for_compaction(self, now: float) -> bool:
        return now >= self._next_compaction

    def compact(self, now: float, keep: list[tuple[float, float]]) -> None:
        self._next_compaction = now + COMPACT_EVERY_S
        self._writer.close()  # the file is replaced: a writer left open would append to the old one
        with contextlib.suppress(Exception):  # a file that cannot be compacted stays as it is; sampling goes on
            compact_file(self.path, self.kind, now, keep=keep)
        self._writer = JsonlWriter(self.path)

    def close(self) -> None:
        self._writer.close()


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
        self._host = SampleFile(run_dir, "host")
        self._procs = SampleFile(run_dir, "procs")
        self.files = (self._host, self._procs)
        self._windows = WindowSpans(run_dir / EVENTS)
        self._files = ProcFiles(held_files_budget()) if PROCFS else None
        self._host_reader = host_reader(self._files)
        self._tree: TreeReader | None = None
        self._job: TreeReader | None = None
        self._limits: CpuLimits | None = None

    def watch(self, pid: int, job_root: int | None = None) -> None:
        """Sample the script's tree (`pid`), and the rest of the job under `job_root` (torchrun's agent)."""
        self._tree = tree_reader(self._files, pid)
        self._job = tree_reader(self._files, job_root) if job_root is not None else None
        self._limits = CpuLimits(self._files, pid) if self._files is not None else None

    def tick(self) -> None:
        t = time.time()
        host = self._host_reader.sample(t)
        if self._limits is not None:
            host = msgspec.structs.replace(host, cpu_pressure_s=self._limits.pressure_s(),
                                           throttled_s=self._limits.throttled_s())
        procs = self._tree.sample() if self._tree is not None else None
        if self._job is not None:
            own = {p.pid for p in procs or ()}
            host = msgspec.structs.replace(host, job_cpu={str(p.pid): round(p.cpu_s, 3) for p in self._job.sample()
                                                          if p.pid not in own})
        self._host.write(host)
        if procs is not None:
            self._procs.write(ProcsRow(t=t, procs=procs))
        if self._host.due_for_compaction(t):
            keep = self._windows.spans()
            for file in (self._host, self._procs):  # the same `now`, so their merged rows keep the same times
                file.compact(t, keep)

    def close(self) -> None:
        self._host.close()
        self._procs.close()
        if not self.is_alive():  # a tick still running would read a closed (or reused) descriptor
            for reader in (self._host_reader, self._tree, self._job, self._limits):
                if reader is not None:
                    reader.close()


class GpuSampler(_Ticker):
    def __init__(self, run_dir: Path, interval_s: float, nvml: Nvml) -> None:
        super().__init__("gpudoctor-gpu-sampler", interval_s)
        self._nvml = nvml
        self._out = SampleFile(run_dir, "gpu")
        self.files = (self._out,)
        self._windows = WindowSpans(run_dir / EVENTS)

    def tick(self) -> None:
        t = time.time()
        self._out.write(GpuRow(t=t, gpus=self._nvml.sample(with_pcie=self.samples % PCIE_EVERY == 0)))
        if self._out.due_for_compaction(t):
            self._out.compact(t, self._windows.spans())

    def close(self) -> None:
        self._out.close()
        self._nvml.shutdown()


class Samplers:
    """Starts what can run on this machine and records, for the manifest, what could not and why."""

    def __init__(self, run_dir: Path, interval_s: float) -> None:
        self.collectors: dict[str, CollectorStatus] = {}
        self.gpus: list[GpuInfo] = []
        self.driver: str | None = None
        self.host = HostSampler(run_dir, interval_s)
        self.collectors["host"] = CollectorStatus(ok=True, interval_s=interval_s)
        self.gpu: GpuSampler | None = None
        try:
            nvml = Nvml()
            self.gpus, self.driver = nvml.describe()
            self.gpu = GpuSampler(run_dir, interval_s, nvml)
            self.collectors["nvml"] = CollectorStatus(ok=True, interval_s=interval_s)
        except NvmlUnavailable as exc:
            self.collectors["nvml"] = CollectorStatus(ok=False, reason=str(exc))

    def start(self, pid: int) -> None:
        # A torchrun rank: its parent is torchrun's agent, whose other children are the job's other ranks.
        self.host.watch(pid, job_root=os.getppid() if torchrun_rank() is not None else None)
        self.host.start()
        if self.gpu:
            self.gpu.start()

    def stop(self) -> None:
        for name, sampler in (("host", self.host), ("nvml", self.gpu)):
            if sampler is not None and sampler.is_alive():
                sampler.stop()
                self.collectors[name] = msgspec.structs.replace(
                    self.collectors[name], samples=sampler.samples, sampler_cpu_s=round(sampler.cpu_s, 4),
                    **_stopped_early(sampler.files))


def _stopped_early(files: tuple[SampleFile, ...]) -> dict[str, object]:
    """The collector's status when one of its files stopped taking samples: not ok, and why."""
    failed = next((f for f in files if f.failed is not None), None)
    if failed is None or failed.failed is None:
        return {}
    reason = failed.failed.strerror or str(failed.failed)
    return {"ok": False, "reason": f"sampling stopped early: {failed.path} could not be written ({reason})"}
