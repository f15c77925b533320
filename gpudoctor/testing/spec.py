"""What a `BundleBuilder` has been told, as typed values; the built_* modules turn a `BundleSpec` into files.

Instrumentation facts are kept as the bundle's own records (a loader is a `LoaderEvent`, a copy a `CopyRow`),
so that the builder and the recorder describe a run with the same types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpudoctor.bundle.events import (
    AnyEvent,
    CopyRow,
    CudaDevice,
    CudaMemory,
    ForkEvent,
    ForwardSiteEvent,
    GilSummary,
    LoaderEvent,
    Phases,
    ProcessStartEvent,
    SyncRow,
    ThreadStartEvent,
)
from gpudoctor.bundle.manifest import GpuInfo
from gpudoctor.bundle.records import Site
from gpudoctor.bundle.samples import GpuEntry, Merged

GiB = 1024 ** 3
DEFAULT_START = 1_000_000.0  # the first step's start, in seconds since the epoch: small, so times keep full precision
DEFAULT_PID = 4242
DEFAULT_STREAM = 7
H100_MEMORY = 85_520_809_984
H100_THREADS_PER_SM = 2048  # 64 resident warps of 32 threads
H100 = CudaDevice(name="NVIDIA H100 80GB HBM3", total_memory=H100_MEMORY, capability="9.0", multiprocessors=132)
WINDOW_STATES = ("warmup", "active")
PROFILER_REASON = "the script ended before the profiling window could write its trace"

Row = TypeVar("Row", CopyRow, SyncRow)


@dataclass(frozen=True)
class Settings:
    """The builder's own attributes when it writes: where, which script, the window, when and which process."""

    path: Path
    script: str
    wait: int
    warmup: int
    active: int | None  # None: every step after wait and warmup
    start: float
    pid: int
    args: tuple[str, ...] = ()  # the script's command-line arguments


@dataclass(frozen=True)
class StepSpec:
    index: int
    start: float
    wall_s: float
    data_wait_s: float
    window: str
    batches: int
    source: str
    phases: Phases
    gil: GilSummary | None
    cuda_memory: CudaMemory | None
    copies: list[CopyRow]  # given to step() itself; copy()'s rows are placed when the bundle is written
    syncs: list[SyncRow]
    data_wait_cpu_s: float | None = None  # the waiting thread's CPU in the data wait (None: not measured)

    @property
    def end(self) -> float:
        return self.start + self.wall_s

    @property
    def in_window(self) -> bool:
        return self.window in WINDOW_STATES


@dataclass(frozen=True)
class ProcessSpec:
    """A process of the script's tree, sampled at a steady rate."""

    pid: int
    ppid: int
    name: str
    thread_cores: tuple[float, ...]
    threads: int
    rss: int
    ctx_invol_per_s: float
    ctx_vol_per_s: float
    run_delay_share: float | None = None  # seconds per second the main thread waits for a core
    gpu: bool | None = False  # holds a GPU's device file open (None: not looked at)
    thread_run_delay: tuple[float, ...] = ()  # each thread's, in the order of thread_cores (empty: not kept)

    @property
    def cores(self) -> float:
        return sum(self.thread_cores)


@dataclass(frozen=True)
class HostSpec:
    """host_samples()'s arguments: CPU in cores, swap in bytes per second, memory in bytes."""

    other_cores: float = 0.0
    tree_cores: float | None = None
    busy_cores: float | None = None
    swap_in_bps: float = 0.0
    swap_out_bps: float = 0.0
    swap_used: int = 0
    mem_available: int | None = None
    load1: float | None = None
    interval_s: float = 0.1
    cpu_pressure: float | None = 0.0  # seconds per second some task on the host waits for a core
    throttled: float | None = 0.0  # seconds per second the script's cgroup is throttled


@dataclass(frozen=True)
class GpuOp:
    """A kernel, memcpy or memset in the trace; times in seconds since the epoch."""

    kind: str  # kernel | memcpy | memset
    name: str
    start: float
    dur: float
    device: int
    stream: int
    bytes: int | None
    warps_per_sm: float | None = None  # a kernel's resident warps per SM, as CUPTI reports it


@dataclass(frozen=True)
class RuntimeCall:
    """A CUDA runtime call on the host, in the trace."""

    name: str
    start: float
    dur: float


@dataclass(frozen=True)
class ExitSpec:
    ending: str = "completed"
    status: int = 0
    exception: str | None = None
    message: str | None = None
    where: Site | None = None


@dataclass(frozen=True)
class EnvSpec:
    """env()'s facts; None means "derived": cpu_count from cores, threads from cores, GPUs from the samples."""

    cores: int = 8
    cpu_count: int | None = None
    affinity: list[int] | None = None
    memory_total: int = 64 * GiB
    gil_enabled: bool | None = True
    start_method: str | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    python: str | None = "3.11.7"
    torch: str | None = "2.5.1+cu124"
    cuda_build: str | None = "12.4"
    driver: str | None = None
    gpus: list[GpuInfo] | None = None
    cuda_device: CudaDevice | None = None
    cuda_initialized: bool | None = None
    switch_interval_s: float | None = 0.005
    ranks_on_host: int | None = None  # a rank of a job: how many ranks share its host (LOCAL_WORLD_SIZE)
    frameworks: list[str] | None = None  # "lightning", "transformers" (its Trainer), "accelerate"


@dataclass
class BundleSpec:
    """Everything the builder has been told; read, never changed, while the bundle is written."""

    settings: Settings
    steps: list[StepSpec] = field(default_factory=list)
    loaders: list[LoaderEvent] = field(default_factory=list)
    copies: list[tuple[int | None, CopyRow]] = field(default_factory=list)  # (step, row); None: every window step
    syncs: list[tuple[int | None, SyncRow]] = field(default_factory=list)
    forks: list[ForkEvent] = field(default_factory=list)
    started: list[ProcessStartEvent] = field(default_factory=list)
    forward_sites: list[ForwardSiteEvent] = field(default_factory=list)
    recorded: list[AnyEvent] = field(default_factory=list)  # event(): written as given, after the steps
    threads: list[ThreadStartEvent] = field(default_factory=list)
    processes: list[ProcessSpec] = field(default_factory=list)
    host: HostSpec | None = None
    gpus: dict[int, GpuEntry] = field(default_factory=dict)  # each GPU's NVML values, the same in every sample
    gpu_interval_s: float = 0.1
    ops: list[GpuOp] = field(default_factory=list)
    runtime: list[RuntimeCall] = field(default_factory=list)
    raw: dict[str, list[Merged]] = field(default_factory=dict)  # sample_rows(), by kind
    trace_refused: bool = False
    profiler_reason: str = PROFILER_REASON
    exit: ExitSpec = ExitSpec()
    env: EnvSpec = EnvSpec()

    @property
    def first_window_step(self) -> int | None:
        return next((s.index for s in self.steps if s.in_window), None)

    @property
    def writes_trace(self) -> bool:
        if self.trace_refused:
            return False
        return any(s.window == "active" for s in self.steps) or bool(self.ops) or bool(self.runtime)

    @property
    def has_gpu(self) -> bool:
        return bool(self.ops or self.gpus or self.env.gpus or self.env.cuda_device)

    @property
    def cpu_count(self) -> int:
        return self.env.cpu_count or self.env.cores

    @property
    def affinity(self) -> list[int]:
        return list(self.env.affinity) if self.env.affinity is not None else list(range(self.env.cores))

    @property
    def t0(self) -> float:
        """When the first step started (the builder's start without steps)."""
        return self.steps[0].start if self.steps else self.settings.start

    def copies_of(self, step: StepSpec) -> list[CopyRow]:
        return step.copies + _placed(self.copies, step)

    def syncs_of(self, step: StepSpec) -> list[SyncRow]:
        return step.syncs + _placed(self.syncs, step)

    def check_rows(self) -> None:
        """copy() and sync() rows name steps that exist (they may be given before their step is added)."""
        for name, indices in (("copy", [i for i, _ in self.copies]), ("sync", [i for i, _ in self.syncs])):
            for index in indices:
                if index is not None and not 0 <= index < len(self.steps):
                    raise ValueError(f"{name} for step {index}, which does not exist")


def _placed(rows: list[tuple[int | None, Row]], step: StepSpec) -> list[Row]:
    """The rows of copy() or sync() that fall in `step`: given for it, or for every window step."""
    return [row for index, row in rows if index == step.index or (index is None and step.in_window)]
