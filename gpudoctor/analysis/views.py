"""The typed views a rule reads. Every figure is in seconds, bytes or cores; None means "not measured"."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.bundle.events import CudaDevice, CudaMemory
from gpudoctor.bundle.manifest import GpuInfo
from gpudoctor.bundle.records import Site
from gpudoctor.bundle.samples import LOADER_WORKER_NAME


class NotEvaluated(Exception):
    """Raised by a view (or a rule) when the data a rule needs was not collected in this run."""


@dataclass(frozen=True)
class Location:
    """A line in the user's code."""

    file: str
    line: int
    function: str

    @classmethod
    def from_site(cls, site: Site | None) -> Location | None:
        if site is None or not site.file:
            return None
        return cls(site.file, site.line, site.function)

    def to_dict(self) -> dict[str, str | int]:
        return {"file": self.file, "line": self.line, "function": self.function}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class GilStats:
    """Wake-up delays of the GIL probe over one step (seconds)."""

    samples: int
    mean_s: float
    p95_s: float
    max_s: float


@dataclass(frozen=True, slots=True)  # slots: a run of hours has hundreds of thousands
class Step:
    """One training (or inference) step, from the instrumentation and, inside the window, the trace."""

    index: int
    start: float  # seconds since the epoch
    wall_s: float
    data_wait_s: float
    window: str  # waiting | warmup | active | closed | failed
    data_wait_cpu_s: float | None = None  # the waiting thread's CPU time in the data wait; None: not measured
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    copy_s: float | None = None  # host time spent in host<->device copy calls
    sync_s: float | None = None  # host time blocked in synchronizing calls
    gpu_busy_s: float | None = None  # kernels, copies and memsets, union over streams, busiest device
    gpu_compute_s: float | None = None  # kernels only
    gpu_idle_s: float | None = None
    kernels: int | None = None
    gil: GilStats | None = None
    cuda_memory: CudaMemory | None = None
    backwards: int = 0  # backward() calls in the step
    forwards: int = 0  # calls of the outermost model in the step (0 where the bundle did not count them)
    batches: int = 0  # DataLoader batches the step took (0 from a bare trace, which does not count them)
    last_backward: float | None = None  # when the last of several backward() calls started (accumulation)
    ends_run: bool = False  # closed by the script's end, not by the next step: its time is not the loop's

    @property
    def end(self) -> float:
        return self.start + self.wall_s

    @property
    def other_s(self) -> float:
        """Host time not in any measured phase (the user's own Python, logging, ...)."""
        known = self.data_wait_s + sum(x or 0.0 for x in (self.forward_s, self.backward_s, self.optimizer_s,
                                                          self.copy_s, self.sync_s))
        return max(0.0, self.wall_s - known)


@dataclass(frozen=True)
class LoaderInfo:
    """A DataLoader the script iterated, with its settings and where it was built."""

    location: Location | None
    num_workers: int
    pin_memory: bool
    batch_size: int | None
    prefetch_factor: int | None
    persistent_workers: bool
    dataset: str
    dataset_len: int | None
    start_method: str | None
    sampler: str | None = None
    drop_last: bool = False
    made_by: str | None = None  # the library that built it ("transformers": the Trainer's), None for the script

    @property
    def built_at(self) -> str | None:
        """Where it was built, as 'file:line': how a try's remedy finds it again (gpudoctor.remedy.LoaderRemedy)."""
        return f"{self.location.file}:{self.location.line}" if self.location else None


@dataclass(frozen=True)
class LoaderView:
    """The DataLoaders the script iterated, in the order it first iterated them."""

    loaders: list[LoaderInfo]

    @property
    def main(self) -> LoaderInfo | None:
        """The first loader iterated: in a training script, the training loader."""
        return self.loaders[0] if self.loaders else None

    @property
    def location(self) -> Location | None:
        return self.main.location if self.main else None


@dataclass(frozen=True)
class CopySite:
    """Host<->device copies made from one line, summed over the window's steps."""

    direction: str  # h2d | d2h
    pinned: bool | None
    non_blocking: bool
    count: int
    bytes: int
    host_s: float
    max_s: float
    location: Location | None


@dataclass(frozen=True)
class SyncSite:
    """Synchronizing calls (.item(), .cpu(), print, torch.cuda.synchronize, ...) from one line."""

    kind: str
    count: int
    host_s: float
    max_s: float
    location: Location | None
    via: str | None = None  # the library module that made the calls for that line


@dataclass(frozen=True)
class ThreadInfo:
    """A thread the script (or a library it uses) started, and where."""

    name: str
    target: str | None
    module: str | None  # the module of the thread's target function
    daemon: bool
    location: Location | None
    native_id: int | None = None  # the OS thread id, as in the process samples' per-thread CPU

    @property
    def is_library(self) -> bool:
        """A thread that torch or the stdlib starts for itself (the DataLoader's pin-memory thread, ...)."""
        return self.module is not None and self.module.split(".")[0] in ("torch", "gpudoctor", "multiprocessing")


@dataclass(frozen=True)
class ForkInfo:
    """A fork of the script's process (DataLoader workers, a fork-context Pool, os.fork) and where."""

    time: float
    cuda_initialized: bool
    start_method: str | None
    dataloader_worker: bool
    location: Location | None


@dataclass(frozen=True)
class StartedProcess:
    """A process the script started itself (not a DataLoader worker), which gpudoctor does not profile."""

    pid: int | None
    start_method: str | None
    target: str | None
    location: Location | None
    cores: float | None  # its mean CPU use over its sampled life; None if it was never sampled
    used_gpu: bool | None  # held a GPU open; None where that cannot tell (a forked child inherits the files)

    @property
    def worked(self) -> bool:
        """Used the GPU, or at least half a core: work the report of the main process does not show."""
        return bool(self.used_gpu) or (self.cores or 0.0) >= 0.5


@dataclass(frozen=True)
class ProcessInfo:
    """One process of the script's tree over the run, from the parent's samples."""

    pid: int
    ppid: int | None
    name: str
    role: str  # main | child
    cpu_mean: float  # cores
    cpu_max: float
    rss_max: int
    threads_max: int
    thread_cores: dict[str, float]  # mean cores used by each thread, by thread id
    ctx_invol_per_s: float | None  # involuntary context switches: the OS took the CPU away
    # Seconds per second the main thread was ready to run but waited for a core; None where not measured
    run_delay_share: float | None = None
    thread_run_delay: dict[str, float] = field(default_factory=dict)  # the same, by thread id, where kept
    gpu: bool = False  # held a GPU's device file open in some sample (ProcEntry.gpu)

    @property
    def is_loader_worker(self) -> bool:
        """A DataLoader worker, by the name torch gives one."""
        return self.name == LOADER_WORKER_NAME

    @property
    def busy_threads(self) -> int:
        """Threads using at least a fifth of a core (OS threads: intra-op pools and CUDA's included)."""
        return sum(1 for cores in self.thread_cores.values() if cores >= 0.2)

    def busy_among(self, thread_ids: set[int]) -> int:
        """How many of the given OS threads use at least a fifth of a core."""
        return sum(1 for tid, cores in self.thread_cores.items() if cores >= 0.2 and int(tid) in thread_ids)

    def sharing_among(self, thread_ids: set[int], min_cores: float = 0.05, min_of_busiest: float = 0.25) -> int:
        """How many of the given OS threads take turns on the work: each uses at least `min_cores` and at least
        `min_of_busiest` of the busiest one's cores. Eight threads sharing one GIL use ~0.12 core each (the
        thread-pool inference fixture), too little for `busy_among`; a pin-memory thread beside a busy main
        one uses a few percent of it."""
        cores = [c for tid, c in self.thread_cores.items() if int(tid) in thread_ids]
        floor = max(min_cores, min_of_busiest * max(cores, default=0.0))
        return sum(1 for c in cores if c >= floor)


@dataclass(frozen=True)
class SeriesPoint:
    """One sample of a time series: its time (seconds since the epoch) and its values by name."""

    t: float
    values: dict[str, float | None]


@dataclass
class Samples:
    """Time series sampled by the parent. Rates are per second over each interval."""

    host: list[SeriesPoint] = field(default_factory=list)  # busy_cores, tree_cores, other_cores, swap_in_bps, ...
    gpu: dict[int, list[SeriesPoint]] = field(default_factory=dict)  # util, mem_used, ...

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu)


@dataclass(frozen=True)
class Env:
    """Where the script ran."""

    cores: int | None  # cores this process may run on (affinity)
    cpu_count: int | None
    memory_total: int | None
    gil_enabled: bool | None
    start_method: str | None
    intra_op_threads: int | None
    python: str | None
    torch: str | None
    cuda_build: str | None
    driver: str | None
    gpus: list[GpuInfo]  # as NVML describes them
    cuda_device: CudaDevice | None  # the one the script trains on, as torch saw it
    switch_interval_s: float | None = None  # how long a Python thread may hold the GIL before it is asked to let go
    ranks_on_host: int = 1  # a torchrun job's ranks on this host (LOCAL_WORLD_SIZE), each with the same threads
    frameworks: tuple[str, ...] = ()  # "lightning", "transformers" (its Trainer), "accelerate": what the script runs on


@dataclass(frozen=True)
class Exit:
    """How the script ended: completed, exit, exception, signal, timeout, interrupted, max_steps or no_start."""

    ending: str
    status: int | None
    exception: str | None
    message: str | None
    location: Location | None


@dataclass(frozen=True)
class WindowInfo:
    """One profiling window: `gpudoctor profile --every` records several, each with its own trace."""

    index: int
    first_step: int  # the first step it recorded (warm-up included)
    start: float  # seconds since the epoch, when it opened
    trace: str | None  # its trace file in the run directory, None if it was not written
