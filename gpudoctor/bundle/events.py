"""events.jsonl: what the script's process reports, one record per line, each with its `kind` and time `t`.

The recorder writes these records (gpudoctor.collect) and `Run` reads them (gpudoctor.analysis); nothing else
spells their keys. Facts that the manifest also keeps (the process, torch, the window's environment) are
records of their own, which the events extend.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from gpudoctor.bundle.records import Count, Event, Record, Seconds, Site
from gpudoctor.bundle.step_events import (
    CompileEvent,
    CudaMemory,
    DynamoEvent,
    FlopsEvent,
    HostLine,
    LoaderStartEvent,
    LossEvent,
    OomEvent,
    OptimizerEvent,
    PauseEvent,
    StartupEvent,
    StartupLinesEvent,
)


# -- facts the manifest keeps too ------------------------------------------------------------------
class ProcessFacts(Record, frozen=True):
    """The script's process, as it started."""

    pid: int | None = None
    python: str | None = None
    implementation: str | None = None
    executable: str | None = None
    gil_enabled: bool | None = None
    cpu_count: int | None = None
    affinity: list[int] | None = None
    start_method: str | None = None
    switch_interval_s: float | None = None  # sys.getswitchinterval(): how long a thread may hold the GIL
    main_native_id: int | None = None  # the OS id of the main thread, as in the process samples
    # Under torchrun (RANK, WORLD_SIZE and LOCAL_WORLD_SIZE in the environment): this rank, and how many there are.
    rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None  # ranks on this host


class TorchFacts(Record, frozen=True):
    version: str | None = None
    cuda_build: str | None = None
    cuda_built: bool | None = None


class CudaDevice(Record, frozen=True):
    """The device the script trains on, as torch saw it when the window opened."""

    index: int = 0
    name: str | None = None
    total_memory: int | None = None
    free_memory: int | None = None
    capability: str | None = None
    multiprocessors: int | None = None


class WindowFacts(Record, frozen=True):
    """torch's threads and device when the profiling window opened."""

    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    cuda_initialized: bool | None = None
    cuda_device: CudaDevice | None = None
    # The training frameworks the script runs through: "lightning", "transformers" (its Trainer), "accelerate"
    frameworks: list[str] | None = None


# -- what a step accumulates -------------------------------------------------------------------------
class Phases(Record, frozen=True):
    """Host seconds in each phase of a step (inside the window only)."""

    forward: Seconds = 0.0
    backward: Seconds = 0.0
    optimizer: Seconds = 0.0
    # The optimizer's seconds leave out the forward, backward, copies and syncs timed inside its step() (a closure
    # that computes the loss, as Lightning's and LBFGS's do); bundles before it counted them twice.
    exclusive: bool = False


class CopyRow(Record, frozen=True):
    """Host<->device copies from one line within one step."""

    direction: Literal["h2d", "d2h"]
    pinned: bool | None = None
    non_blocking: bool = False
    count: Count = 1
    bytes: Count = 0
    host_s: Seconds = 0.0
    max_s: Seconds = 0.0
    site: Site | None = None


class SyncRow(Record, frozen=True):
    """Synchronizing calls (.item(), print(tensor), torch.cuda.synchronize(), ...) from one line within one step."""

    kind: str
    count: Count = 1
    host_s: Seconds = 0.0
    max_s: Seconds = 0.0
    site: Site | None = None
    via: str | None = None  # the library module that made the call for that line (torch.amp.grad_scaler, ...)


class GilSummary(Record, frozen=True):
    """Wake-up delays of the GIL probe over one step."""

    samples: Count
    mean_s: Seconds
    p95_s: Seconds
    max_s: Seconds


# -- the events (the base, Event, is in bundle.records; the slow step's, in bundle.step_events) ---------
class ProcessEvent(ProcessFacts, Event, tag="process", frozen=True):
    t: float | None = None


class TorchEvent(TorchFacts, Event, tag="torch", frozen=True):
    t: float | None = None


class EnvWindowEvent(WindowFacts, Event, tag="env_window", frozen=True):
    t: float | None = None


class CollectorEvent(Record, Event, tag="collector", frozen=True):
    """A collector inside the script's process that worked or not (nvtx, the profiler), and why."""

    name: str
    ok: bool
    reason: str | None = None
    t: float | None = None


class ThreadStartEvent(Record, Event, tag="thread_start", frozen=True):
    name: str = ""
    daemon: bool = False
    native_id: int | None = None  # the OS thread id, as in the process samples' per-thread CPU
    target: str | None = None
    module: str | None = None  # the module of the thread's target function
    site: Site | None = None
    t: float | None = None


class ForkEvent(Record, Event, tag="fork", frozen=True):
    parent_pid: int | None = None
    cuda_initialized: bool = False
    start_method: str | None = None
    site: Site | None = None
    dataloader_worker: bool = False
    t: float | None = None


class ProcessStartEvent(Record, Event, tag="process_start", frozen=True):
    """A process the script started through multiprocessing (torch.multiprocessing.spawn, a Pool, Process)."""

    pid: int | None = None
    start_method: str | None = None  # fork, spawn or forkserver: only fork's child shares the parent's memory
    target: str | None = None  # the function it runs (for torch.multiprocessing.spawn, the one it was given)
    module: str | None = None
    site: Site | None = None
    dataloader_worker: bool = False
    t: float | None = None


class RankEvent(Record, Event, tag="rank", frozen=True):
    """This process is a rank of a job: as gpudoctor followed it into the process (`source`: "environment" for
    RANK or LOCAL_RANK, "torch.multiprocessing" for mp.spawn's process index), or as torch.distributed numbers it
    once the process joined its group ("init_process_group", which wins)."""

    rank: int
    source: str
    world_size: int | None = None
    backend: str | None = None
    t: float | None = None


class LoaderEvent(Record, Event, tag="loader", frozen=True):
    """A DataLoader the script iterated, with its settings and where it was built."""

    loader_id: int | None = None
    site: Site | None = None
    num_workers: Count = 0
    pin_memory: bool = False
    batch_size: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    drop_last: bool = False
    dataset: str = ""
    dataset_len: int | None = None
    start_method: str | None = None
    sampler: str | None = None  # its sampler's class: RandomSampler for shuffle=True, SequentialSampler by default
    # The library that built it (its top-level package: "transformers" for the Trainer's), None for the script
    made_by: str | None = None
    # The intra-op threads a try's remedy sets in each of its workers (gpudoctor.collect.remedies); None without
    worker_threads: int | None = None
    t: float | None = None


class HostLinesEvent(Record, Event, tag="host_lines", frozen=True):
    """The user's lines the main thread was in, sampled every `interval_s` in the window's detail steps (the
    most sampled first, at most ten); `samples` counts every look, a line outside the user's code included."""

    samples: Count
    interval_s: float
    lines: list[HostLine] = msgspec.field(default_factory=list)
    t: float | None = None


class BackwardSiteEvent(Record, Event, tag="backward_site", frozen=True):
    """Where the script calls backward() (once per line)."""

    site: Site | None = None
    t: float | None = None


class ForwardSiteEvent(Record, Event, tag="forward_site", frozen=True):
    """Where the script calls its outermost model (once per line)."""

    module: str | None = None
    site: Site | None = None
    t: float | None = None


class StepSourceEvent(Record, Event, tag="step_source", frozen=True):
    source: str
    at_step: Count = 0
    t: float | None = None


class StepLessGilEvent(Record, Event, tag="stepless_gil", frozen=True):
    """The GIL probe's wake-up delays in a program that marked no step (collect.stepless), from the moment it
    started watching (`watched_s` after the recorder did) to the script's end."""

    gil: GilSummary
    watched_s: Seconds
    t: float | None = None


class StepEvent(Record, Event, tag="step", frozen=True):
    """One step, written when it ends. Only the window's detail steps carry phases, copies, syncs and the
    GIL probe's figures; its warm-up, active and detail steps carry CUDA memory figures."""

    step: Count
    t0: float  # time.time() at the start, comparable with the parent's samples
    t1: float
    wall_s: Seconds
    data_wait_s: Seconds = 0.0
    # CPU time the waiting thread spent in those waits (time.thread_time()): with no loader workers, what loading
    # the batches took of the CPU; None in bundles from before it was measured
    data_wait_cpu_s: Seconds | None = None
    batches: Count = 0
    backwards: Count = 0  # backward() calls in the step
    forwards: Count = 0  # calls of the outermost model in the step (an evaluation inside a step makes many)
    # time.time() at the last of several backward() calls (gradient accumulation); None with one or none.
    last_backward_t: float | None = None
    # The step that backward() or forward() calls were counting when the script ended: nothing closed it but the
    # end, so its time holds whatever ran after the loop (an evaluation, a checkpoint): no step's pace.
    ends_run: bool = False
    source: str = "none"
    window: str = "waiting"  # waiting | warmup | active | closed | failed
    window_index: Count = 0
    phases: Phases | None = None
    copies: list[CopyRow] | None = None
    syncs: list[SyncRow] | None = None
    gil: GilSummary | None = None
    cuda_memory: CudaMemory | None = None
    t: float | None = None

    @property
    def plain(self) -> bool:
        """A step outside the profiling windows: only its times, wait, batches, model and backward() calls and labels (a
        step that says when its last backward() began is kept whole)."""
        return (self.phases is None and self.copies is None and self.syncs is None and self.gil is None
                and self.cuda_memory is None and self.window_index == 0 and self.last_backward_t is None
                and not self.ends_run)


class StepSpanEvent(Record, Event, tag="step_span", frozen=True):
    """Consecutive steps outside the profiling windows, summarised (bundle.step_spans): a long run's events grow by
    one of these every few seconds instead of one step event a step. The slowest steps are kept exactly; the others'
    wall times and data waits are kept as histograms of 1% bins."""

    first_step: Count
    last_step: Count  # included
    t0: float
    t1: float
    walls: list[tuple[int, Count]]  # (bin, steps): the wall time exp(bin * STEP_BIN) of that many steps
    waits: list[tuple[int, Count]] = msgspec.field(default_factory=list)  # the same for the data waits above zero
    data_wait_cpu_s: Seconds | None = None  # over the span's steps; None where no step received a batch
    batches: Count = 0  # over the span's steps, as are the calls
    backwards: Count = 0
    forwards: Count = 0
    # (step, t0, t1, wall_s, data_wait_s) of the slowest steps, exact
    slowest: list[tuple[Count, float, float, Seconds, Seconds]] = msgspec.field(default_factory=list)
    source: str = "none"
    window: str = "waiting"
    t: float | None = None


class WindowEvent(Record, Event, tag="window", frozen=True):
    """The profiling window opened, closed (its trace written), ended early, or restarted: a stronger step source
    took over, and the steps and windows before this event were not the program's steps (`first_step`: where the
    next window opens)."""

    state: str  # opened | closed | ended_early | restarted
    index: Count = 0  # bundles from before --every have one window and no index
    first_step: Count | None = None
    cuda: bool | None = None
    trace: str | None = None
    export_s: Seconds | None = None
    trace_bytes: Count | None = None
    from_state: str | None = None
    t: float | None = None


class MaxStepsEvent(Record, Event, tag="max_steps", frozen=True):
    steps: Count
    t: float | None = None


class RemedyEvent(Record, Event, tag="remedy", frozen=True):
    """A try's fix, as the script's process first applied it (gpudoctor.collect.remedies), in the script's terms."""

    applied: str
    t: float | None = None


class EndEvent(Record, Event, tag="end", frozen=True):
    """How the script's process ended: its last event (none when it was killed)."""

    reason: str  # completed | exit | exception | interrupted | terminated | max_steps
    steps: Count = 0
    pid: int | None = None
    code: int | None = None
    exception: str | None = None
    message: str | None = None
    where: Site | None = None
    t: float | None = None


AnyEvent: TypeAlias = (
    ProcessEvent | TorchEvent | EnvWindowEvent | CollectorEvent | ThreadStartEvent | ForkEvent | ProcessStartEvent
    | RankEvent | LoaderEvent
    | ForwardSiteEvent | BackwardSiteEvent | HostLinesEvent | StepSourceEvent | StepEvent | StepSpanEvent | WindowEvent
    | MaxStepsEvent
    | EndEvent
    | StepLessGilEvent | RemedyEvent
    | OptimizerEvent | PauseEvent | StartupEvent | LoaderStartEvent | StartupLinesEvent | CompileEvent | DynamoEvent
    | LossEvent | OomEvent | FlopsEvent
)
EVENT_DECODER: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)

__all__ = [
    "EVENT_DECODER", "AnyEvent", "BackwardSiteEvent", "CollectorEvent", "CompileEvent", "CopyRow", "CudaDevice",
    "CudaMemory", "DynamoEvent", "EndEvent", "EnvWindowEvent", "Event", "FlopsEvent", "ForkEvent", "ForwardSiteEvent",
    "GilSummary", "HostLine", "HostLinesEvent", "LoaderEvent", "LoaderStartEvent", "LossEvent", "MaxStepsEvent",
    "OomEvent", "OptimizerEvent", "PauseEvent", "Phases", "ProcessEvent", "ProcessFacts", "ProcessStartEvent",
    "RankEvent", "RemedyEvent", "StartupEvent", "StartupLinesEvent", "StepEvent", "StepLessGilEvent",
    "StepSourceEvent", "StepSpanEvent", "SyncRow", "ThreadStartEvent", "TorchEvent", "TorchFacts", "WindowEvent",
    "WindowFacts",
]
