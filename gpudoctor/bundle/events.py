"""events.jsonl: what the script's process reports, one record per line, each with its `kind` and time `t`.

The recorder writes these records (gpudoctor.collect) and `Run` reads them (gpudoctor.analysis); nothing else
spells their keys. Facts that the manifest also keeps (the process, torch, the window's environment) are
records of their own, which the events extend.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from gpudoctor.bundle.records import Count, Record, Seconds, Site


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


class CudaMemory(Record, frozen=True):
    """The CUDA caching allocator at a step's end (torch.cuda.memory_stats): bytes allocated and reserved, their
    peaks, and the allocator's counters since the process started (None where not recorded: older bundles)."""

    allocated: Count = 0
    reserved: Count = 0
    max_allocated: Count = 0
    max_reserved: Count | None = None
    alloc_retries: Count | None = None  # num_alloc_retries: cudaMalloc failed, the cache was freed, then retried
    ooms: Count | None = None  # num_ooms
    device_allocs: Count | None = None  # num_device_alloc: cudaMalloc calls
    device_frees: Count | None = None  # num_device_free: cudaFree calls
    inactive_split: Count | None = None  # inactive_split_bytes.all.current: free bytes inside split blocks


# -- the events ----------------------------------------------------------------------------------------
class Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind", omit_defaults=True):
    """An events.jsonl record: its class's tag is its `kind`. Every event has its time `t` (seconds since the
    epoch), set by the recorder when it is written."""


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


class HostLine(Record, frozen=True):
    file: str
    line: int
    function: str = ""
    samples: Count = 0


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


class OptimizerEvent(Record, Event, tag="optimizer", frozen=True):
    """An optimizer the script stepped, as its first step() found it, and where the script built it: whether it
    steps its tensors one by one in Python (`per_tensor`: foreach off, or an optimizer without foreach or fused)."""

    name: str  # its class, e.g. Adam
    module: str | None = None  # the class's module, e.g. torch.optim.adam
    site: Site | None = None  # the user's line that built it
    tensors: Count = 0  # the parameters it updates
    foreach: bool | None = None  # as its param_groups have it (None: torch's default)
    fused: bool | None = None
    takes_foreach: bool = False  # whether its class takes foreach=
    takes_fused: bool = False
    devices: list[str] = msgspec.field(default_factory=list)  # the parameters' device types
    per_tensor: bool = False
    t: float | None = None


class PauseEvent(Record, Event, tag="pause", frozen=True):
    """A call that held the script outside the step's usual work: a checkpoint written (`save`: torch.save;
    `checkpoint`: torch.distributed.checkpoint), a garbage collection (`gc`), the model put in eval mode (`eval`:
    an evaluation loop starts; `seconds` 0, the step's excess says how long it ran)."""

    cause: str  # save | checkpoint | gc | eval
    step: Count  # the step it happened in
    seconds: Seconds = 0.0
    site: Site | None = None
    t: float | None = None


class StartupEvent(Record, Event, tag="startup", frozen=True):
    """A phase of the script's start-up, timed where it happened: `torch_import` (import torch), `cuda_init`
    (CUDA's first initialization)."""

    phase: str
    seconds: Seconds
    t: float | None = None


class LoaderStartEvent(Record, Event, tag="loader_start", frozen=True):
    """A DataLoader iterator made (an epoch begins): `seconds` to make it (its workers started), in step `step`."""

    loader_id: int | None = None
    step: Count = 0
    seconds: Seconds = 0.0
    workers: Count = 0
    persistent: bool = False
    t: float | None = None


class StartupLinesEvent(Record, Event, tag="startup_lines", frozen=True):
    """The user's lines the main thread was in before the first step ended, sampled every `interval_s` (the most
    sampled first, at most ten); `samples` counts every look, `importing` those that found it importing a module
    (their lines are not among `lines`)."""

    samples: Count
    interval_s: float
    lines: list[HostLine] = msgspec.field(default_factory=list)
    importing: Count = 0
    t: float | None = None


class CompileEvent(Record, Event, tag="compile", frozen=True):
    """A frame torch.compile compiled (torch._dynamo's compilation metrics), in step `step`: a recompilation says
    why (`recompile_reason`), a graph break resumes in `torch_dynamo_resume_in_*` at the broken line."""

    step: Count
    compile_id: str | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    seconds: Seconds = 0.0
    recompile_reason: str | None = None
    restart_reasons: list[str] = msgspec.field(default_factory=list)  # graph breaks found while compiling it
    t: float | None = None


class DynamoEvent(Record, Event, tag="dynamo", frozen=True):
    """torch._dynamo's own counters at the script's end: graph breaks by reason, and graphs compiled."""

    graph_breaks: dict[str, int] = msgspec.field(default_factory=dict)
    unique_graphs: Count | None = None
    t: float | None = None


class LossEvent(Record, Event, tag="losses", frozen=True):
    """The loss the script handed to backward(), per step (`steps[i]`'s is `values[i]`; a step with several
    backward() calls has several; None: not a finite number), read once at the end so that no step waits for it."""

    steps: list[int] = msgspec.field(default_factory=list)
    values: list[float | None] = msgspec.field(default_factory=list)
    t: float | None = None


class OomEvent(Record, Event, tag="cuda_oom", frozen=True):
    """CUDA ran out of memory: the allocator's state when the error reached the script's end, and the device's."""

    memory: CudaMemory | None = None
    free: Count | None = None  # torch.cuda.mem_get_info: free and total bytes on the device (other processes too)
    total: Count | None = None
    requested: str | None = None  # what the allocation asked for, as the error says it ("2.00 GiB")
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
    | ForwardSiteEvent | BackwardSiteEvent | HostLinesEvent | StepSourceEvent | StepEvent | WindowEvent | MaxStepsEvent
    | EndEvent
    | StepLessGilEvent | RemedyEvent
    | OptimizerEvent | PauseEvent | StartupEvent | LoaderStartEvent | StartupLinesEvent | CompileEvent | DynamoEvent
    | LossEvent | OomEvent
)
EVENT_DECODER: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
