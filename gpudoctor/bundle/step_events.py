"""The slow step's events.jsonl records: the optimizers, pauses, start-up, compilations, losses and CUDA's
out-of-memory error that gpudoctor.collect's step costs record, which the slow-step rules read. Kept apart from
bundle.events, which decodes them with the others (its `AnyEvent`)."""

from __future__ import annotations

import msgspec

from gpudoctor.bundle.records import Count, Event, Record, Seconds, Site


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


class HostLine(Record, frozen=True):
    file: str
    line: int
    function: str = ""
    samples: Count = 0


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


class MatrixWork(Record, frozen=True):
    """The floating-point operations of one kind of matrix work in a step (`kind`: gemm, conv or attention) whose
    first input is of `dtype` ("float32", "bfloat16", "float16", "float8_e4m3fn", ...), as torch's own FLOP
    formulas count them (torch.utils.flop_counter), and how many operators made them."""

    kind: str
    dtype: str
    flops: Count = 0
    calls: Count = 0


class FlopsEvent(Record, Event, tag="flops", frozen=True):
    """The matrix work of one step (`step`, a detail step's), counted operator by operator, with the settings that
    choose the precision fp32 products run in (TF32 for matmuls and for cuDNN); or, `reason`, why it was not
    counted (a compiled model, which a dispatch mode would make dynamo trace again)."""

    step: Count | None = None
    work: list[MatrixWork] = msgspec.field(default_factory=list)
    tf32_matmul: bool | None = None
    tf32_conv: bool | None = None
    reason: str | None = None
    t: float | None = None
