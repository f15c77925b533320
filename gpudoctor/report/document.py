"""The Report's shape: the JSON that report.model builds, the renderers format and findings.json holds part of.

Each TypedDict types a dict the report already was, key for key, so typing it changes no output. A key that is
only sometimes there sits in a `total=False` class that adds it to the keys always there. findings.json's records
(FindingJson, ...) are in gpudoctor.bundle.findings; its document is FindingsDocument, a fixed subset of Report.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from gpudoctor.bundle.findings import FindingJson, LocationJson, NotEvaluatedJson, RuleErrorJson
from gpudoctor.engine.windows import WindowStats

__all__ = [
    "AfterTryFinding", "AfterTryJson", "BreakdownJson", "Card", "Charts", "ExceptionFacts", "FindingsDocument",
    "GpuBar", "HostSegment", "KernelBinRow", "KernelChart", "LegendItem", "Links", "NotMeasuredRow", "PanelJson",
    "PhaseRow", "RankTimeJson", "Report", "RunFacts", "SeriesRow", "SourceLine", "SourceSnippet", "SpanJson",
    "Status", "StepBarRow", "StepChart", "StepRow", "Summary", "ThroughputJson", "TimelineChart", "TopKernel",
    "WindowRow", "WindowSettingsJson",
]

Status = Literal["no_steps", "problems", "unexplained", "partial", "healthy"]


# -- the verdict and the facts at the top ------------------------------------------------------------
class _SummaryFields(TypedDict):
    verdict: str
    gpu_idle_share: float | None
    healthy: bool
    problems: int
    status: Status


class AfterTryFinding(TypedDict):
    code: str
    title: str
    impact: float | None
    saving_s: float | None


class AfterTryJson(TypedDict):
    """What the fastest measured try's own run still shows (report.together.LeftAfterTry)."""

    code: str
    step_s: float
    bundle: str
    saving: float
    findings: list[AfterTryFinding]


class Summary(_SummaryFields, total=False):
    waits_for: int  # a rank of a job that waits for another in every collective: that rank
    after_try: AfterTryJson  # a run whose fixes were tried: what the fastest measured try leaves


class ExceptionFacts(TypedDict):
    """What the script raised, when it ended with an exception."""

    type: str
    message: str
    location: LocationJson | None


class WindowSettingsJson(TypedDict):
    """The profiling window asked for, in steps (the manifest's WindowSettings)."""

    wait: int
    warmup: int
    active: int
    every_s: float | None


class _RunFields(TypedDict):
    script: str | None
    module: bool
    args: list[str]
    command: str | None
    cwd: str | None
    created: str | None
    duration_s: float | None
    python: str | None
    torch: str | None
    cuda: str | None
    driver: str | None
    gpus: list[str | None]
    cuda_device: str | None  # the GPU the script used, as torch named it
    cores: int | None
    steps_total: int
    steps_analysed: int
    median_step_s: float | None
    step_s: float | None  # the step at the run's pace: savings and speed-ups are of it (analysis.timebase.step_time)
    step_s_basis: str | None  # unprofiled, analysed or gpu_work
    step_s_steps: int
    step_s_evaluations: int  # steps left out of step_s: they ran an evaluation (absent in older documents)
    step_s_stalls: int  # steps left out of step_s: they stalled outside their data wait (absent in older documents)
    step_source: str | None  # marker, optimizer, backward, dataloader, forward, profiler_step
    window_distortion: float | None  # median profiled step over the median step outside the windows
    window_distortion_reason: str | None
    median_step_outside_window: bool  # median_step_s from the steps outside a distorting window
    gpu_work_per_step_s: float | None  # the GPU's work for one analysed step, from the trace (None without one)
    host_ran_ahead: bool  # the GPU's work per step took longer than the host's mean step after start-up
    ending: str | None
    exit_status: int | None
    exception: ExceptionFacts | None
    window: WindowSettingsJson | None
    trace_only: bool
    trace: str | None
    budget: BudgetJson | None  # where the analysed steps' time went, split once (analysis.budget)
    host_lines: list[HostLineJson]  # the user's lines the host spends its time on, the most sampled first
    throughput: ThroughputJson | None  # one step's matrix work against the device's peak (analysis.throughput)
    cpu_wait: CpuWaitJson  # the feeding threads' wait for a core, the host's CPU pressure (analysis.cpu_wait)


class CpuWaitJson(TypedDict):
    """Shares of the wall time over the steady steps; None where this machine does not keep them."""

    main_thread: float | None  # the main thread's run delay
    loader_workers: float | None  # the median DataLoader worker's
    workers: int
    pin_memory_thread: float | None
    host_pressure: float | None  # some runnable task waiting for a core (/proc/pressure/cpu)
    throttled: float | None  # the script's cgroup held back by its CPU limit


class ThroughputJson(TypedDict):
    flops: float  # one step's matrix products, convolutions and attention
    by_precision: dict[str, float]  # FLOPs by the precision each ran in: fp32, tf32, bf16, fp8
    tflops: float  # achieved, at the run's pace
    device: str | None
    peak_tflops: dict[str, float] | None  # the device's dense peaks by precision
    utilization: float | None  # the share of the step that work would take at the peaks
    reason: str | None  # why there is no utilization, or no count
    other_share: float | None  # the GPU's kernel time outside matrix work: elementwise, norms, the optimizer


class BudgetSliceJson(TypedDict):
    slice: str  # gpu_busy | collective | data_wait | stall | sync | copy | host | unexplained
    label: str
    seconds: float  # mean per analysed step
    share: float  # of the mean step
    claimed_by: list[str]  # the codes of the findings whose saving is made of this slice


class HostLineJson(TypedDict):
    file: str
    line: int
    function: str
    share: float  # of the samples of the main thread's stack in the detail steps


class BudgetJson(TypedDict):
    step_s: float  # the run's step time (run.step_s)
    steps: int
    slices: list[BudgetSliceJson]
    profiler_s: float  # the profiler's own cost in each profiled step, left out of the slices


class RankTimeJson(TypedDict):
    """A rank's step at its pace, split as its own report's budget (gpudoctor.job.figures.RankTime)."""

    step_s: float
    computing_s: float
    communicating_s: float
    waiting_for_ranks_s: float
    data_wait_s: float
    other_host_s: float


class _RankFields(TypedDict):
    """One rank of a job, in the merged findings.json (the figures per step but `step_s` are medians of its
    analysed steps, the profiled ones; see gpudoctor.job.figures)."""

    rank: int
    median_step_s: float | None
    step_s: float | None  # the rank's step at its pace (its report's step_s)
    data_wait_s: float | None
    collective_s: float | None
    collective_wait_s: float | None
    exposed_collective_s: float | None
    gpu_idle_s: float | None
    num_workers: int | None
    worker_cpu_per_batch_s: float | None
    loader_limit_s: float | None
    steps_analysed: int
    ending: str | None
    exit_status: int | None
    bundle: str
    host: str | None  # the host it ran on
    node_rank: int | None  # its node, as its launcher numbered the nodes
    clock_offset_s: float | None  # its clock ahead of the first rank's, by the ends of their collectives
    clock_residual_s: float | None  # what the offset is known to within


class RankJson(_RankFields, total=False):
    gpu_idle_share: float | None  # what its own report's summary says
    time: RankTimeJson  # its step at its pace, split as its own report's budget


class RunFacts(_RunFields, total=False):
    world_size: int  # only in a torchrun job's merged findings.json
    ranks: list[RankJson]
    shown_rank: int  # a job's merged report: the rank whose budget, charts and trace it shows
    launcher: str  # a job's merged report: what launched its ranks (torchrun, Lightning, mp.spawn, accelerate)
    gpu_idle_rank: int  # a job's merged report: the rank whose GPU idle share the summary gives (the idlest)


class NotMeasuredRow(TypedDict):
    what: str
    reason: str


# -- where each step's time went -----------------------------------------------------------------------
class PhaseRow(TypedDict):
    phase: str
    label: str
    mean_s: float
    share: float


class BreakdownJson(TypedDict):
    phases: list[PhaseRow]
    mean_step_s: float | None


class StepRow(TypedDict):
    """One analysed step; a phase not measured is None."""

    index: int
    wall_s: float
    window: str
    data_wait_s: float
    copy_s: float | None
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None
    sync_s: float | None
    other_s: float
    gpu_busy_s: float | None
    gpu_idle_s: float | None
    kernels: int | None


class HostSegment(TypedDict):
    key: str
    label: str
    s: float
    share: float


class GpuBar(TypedDict):
    busy_s: float
    idle_s: float
    idle_share: float


class StepBarRow(TypedDict):
    label: str
    first: int
    last: int
    wall_s: float
    host: list[HostSegment]
    gpu: GpuBar | None


class LegendItem(TypedDict):
    key: str
    label: str


class StepChart(TypedDict):
    rows: list[StepBarRow]
    steps_per_row: int
    max_s: float
    legend: list[LegendItem]
    has_gpu: bool
    # Whether the bars split the host's time by phase: the analysed steps run without gpudoctor's per-call hooks,
    # so a bundle that times the phases in the detail steps after them draws these bars as data wait and the rest.
    by_phase: bool


# -- the timeline --------------------------------------------------------------------------------------
class SpanJson(TypedDict):
    start: float
    end: float


class _SeriesFields(TypedDict):
    key: str
    label: str
    values: list[float | None]


class SeriesRow(_SeriesFields, total=False):
    hover_only: bool  # shown in a bucket's tooltip, not drawn; the key is there only when true


class _PanelFields(TypedDict):
    key: str
    title: str
    unit: str
    kind: Literal["line", "bars"]
    max: float
    series: list[SeriesRow]


class PanelJson(_PanelFields, total=False):
    # The top of the panel's scale where a few values far above the rest (a loader's first batch, its workers
    # starting) would flatten them: those are drawn cut at it, their values written above. Absent: `max`.
    clip: float


class TimelineChart(TypedDict):
    duration_s: float
    bucket_s: float
    t: list[float]
    window: SpanJson | None
    other_windows: list[SpanJson]
    steps_per_bucket: list[float | None]
    panels: list[PanelJson]


# -- kernel durations ----------------------------------------------------------------------------------
class KernelBinRow(TypedDict):
    lo_us: float
    hi_us: float | None
    label: str
    count: int
    time_us: float
    count_share: float
    time_share: float


class TopKernel(TypedDict):
    name: str
    count: int
    total_s: float
    mean_us: float
    share: float


class KernelChart(TypedDict):
    count: int
    per_step: float
    median_us: float
    total_s: float
    bins: list[KernelBinRow]
    top: list[TopKernel]
    launch_bound: bool


class _ChartFields(TypedDict):
    steps: StepChart | None
    timeline: TimelineChart | None
    kernels: KernelChart | None


class Charts(_ChartFields, total=False):
    ranks: StepChart | None  # a job's merged report: a bar per rank (gpudoctor.report.charts.ranks_chart)


# -- finding cards, links, windows ---------------------------------------------------------------------
class SourceLine(TypedDict):
    number: int
    text: str
    highlight: bool


class SourceSnippet(TypedDict):
    file: str
    line: int
    changed_since_run: bool
    lines: list[SourceLine]


class Card(TypedDict):
    id: str
    finding: FindingJson  # the finding as findings.json has it
    impact_percent: float | None
    source: SourceSnippet | None
    doc: list[str]


class _LinkFields(TypedDict):
    trace: str | None
    run: str | None


class Links(_LinkFields, total=False):
    trace_href: str  # the trace relative to the report, once it is written (report.model.link_outputs)


class WindowRow(WindowStats):
    """A profiling window of a run profiled with --every (see engine.windows.WindowStats)."""

    start_s: float | None  # seconds into the run
    charted: bool


class RankRow(TypedDict):
    """A rank of a torchrun job in the merged report: its figures, its own report and its per-step chart."""

    figures: RankJson
    report_href: str | None  # the rank's report.html, relative to the merged one
    problems: int
    chart: StepChart | None
    group: str | None  # the group of rows it opens or belongs to in a big job's table (gpudoctor.job.groups)


# -- the documents -------------------------------------------------------------------------------------
class Report(TypedDict):
    schema_version: int
    gpudoctor_version: str
    run: RunFacts
    summary: Summary
    not_measured: list[NotMeasuredRow]
    breakdown: BreakdownJson
    steps: list[StepRow]
    charts: Charts
    cards: list[Card]
    links: Links
    windows: list[WindowRow]
    ranks: list[RankRow]  # a torchrun job's merged report: one row per rank (empty for one process's run)
    findings: list[FindingJson]
    not_evaluated: list[NotEvaluatedJson]
    errors: list[RuleErrorJson]


class FindingsDocument(TypedDict):
    """findings.json (gpudoctor/schemas/findings.schema.json): these keys of the Report, in this order."""

    schema_version: int
    gpudoctor_version: str
    run: RunFacts
    summary: Summary
    findings: list[FindingJson]
    not_evaluated: list[NotEvaluatedJson]
    errors: list[RuleErrorJson]
    windows: list[WindowRow]
